//! Files that hold secrets (`{ file = ... }` passwords, TLS private keys):
//! refused when others may read or write them, as PostgreSQL refuses its
//! key file, and when they are larger than a secret can be.

use std::path::Path;

/// The largest secret file read (a password, a PEM private key).
pub const MAX_SECRET_FILE: u64 = 64 * 1024;

/// Why `path` may not hold a secret, if it may not.
pub fn check(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o007 != 0 {
        return Err(format!(
            "{} is accessible by others (mode {mode:04o}): make it 0600 (or 0640 for a group that needs it), as PostgreSQL requires of its key file",
            path.display()
        ));
    }
    if meta.len() > MAX_SECRET_FILE {
        return Err(format!(
            "{} is {} bytes, more than a secret file may hold ({MAX_SECRET_FILE})",
            path.display(),
            meta.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_secret_file_others_can_read_or_a_huge_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("fulcrum-private-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, "pw\n").unwrap();
        for (mode, ok) in [(0o600, true), (0o640, true), (0o644, false), (0o602, false)] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(check(&file).is_ok(), ok, "{mode:o}");
        }
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&file, vec![b'x'; MAX_SECRET_FILE as usize + 1]).unwrap();
        assert!(check(&file)
            .unwrap_err()
            .contains("more than a secret file"));
        assert!(check(&dir.join("missing"))
            .unwrap_err()
            .contains("cannot read"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
