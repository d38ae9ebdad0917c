//! A map most clients never fill: one pointer in the session until its
//! first insert, then a `HashMap` kept for the session's life (issue 44,
//! memory per idle client). Cleared, never freed, so a client that does use
//! it allocates once, not per unit of work.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

/// A `HashMap` made on its first insert (48 bytes of an idle session's
/// task each, as a plain `HashMap`). The box is the point: it keeps the
/// map's 48 bytes out of the session until it is used.
#[allow(clippy::box_collection)]
pub(super) struct RareMap<K, V>(Option<Box<HashMap<K, V>>>);

impl<K, V> Default for RareMap<K, V> {
    fn default() -> Self {
        RareMap(None)
    }
}

impl<K: Eq + Hash, V> RareMap<K, V> {
    pub(super) fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|m| m.is_empty())
    }

    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.len())
    }

    pub(super) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_ref()?.get(key)
    }

    pub(super) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_mut()?.get_mut(key)
    }

    /// Makes the map on the first insert.
    pub(super) fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.0.get_or_insert_default().insert(key, value)
    }

    pub(super) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_mut()?.remove(key)
    }

    /// Empties the map; its room stays for the next insert.
    pub(super) fn clear(&mut self) {
        if let Some(m) = &mut self.0 {
            m.clear();
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().flat_map(|m| m.iter())
    }
}

impl<K: Eq + Hash, V> Extend<(K, V)> for RareMap<K, V> {
    /// Makes the map only when there is something to insert.
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, items: I) {
        for (key, value) in items {
            self.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RareMap;

    #[test]
    fn an_unused_map_is_one_pointer_and_allocates_nothing() {
        assert_eq!(std::mem::size_of::<RareMap<Vec<u8>, bool>>(), 8);
        let mut map: RareMap<Vec<u8>, bool> = RareMap::default();
        assert!(map.is_empty() && map.get(&b"s1"[..]).is_none());
        assert_eq!(map.remove(&b"s1"[..]), None);
        map.clear();
        map.extend(Vec::new());
        assert!(map.0.is_none(), "nothing inserted, nothing made");
    }

    #[test]
    fn behaves_as_a_map_and_keeps_its_room_when_cleared() {
        let mut map: RareMap<Vec<u8>, u32> = RareMap::default();
        assert_eq!(map.insert(b"a".to_vec(), 1), None);
        assert_eq!(map.insert(b"a".to_vec(), 2), Some(1));
        map.extend([(b"b".to_vec(), 3)]);
        *map.get_mut(&b"b"[..]).expect("inserted") += 1;
        assert_eq!(
            (map.len(), map.get(&b"a"[..]), map.get(&b"b"[..])),
            (2, Some(&2), Some(&4))
        );
        let mut all: Vec<_> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
        all.sort();
        assert_eq!(all, [(b"a".to_vec(), 2), (b"b".to_vec(), 4)]);
        assert_eq!(map.remove(&b"a"[..]), Some(2));
        map.clear();
        assert!(map.is_empty() && map.0.is_some(), "cleared, not freed");
    }
}
