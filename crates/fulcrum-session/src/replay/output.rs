//! How a transaction's client output is read for replay: the streaming
//! [`Checksum`] over its bytes, the [`Framing`] that says which messages
//! count, and the per-message trace ([`FrameMark`]s) that names the first
//! message a replay answered differently. The log and the replay
//! (`replay.rs`) feed the output through a `Cursor`.

/// A streaming checksum over the bytes and their count: 8 bytes at a time,
/// each word multiplied in and rotated (the bytes of a partial word wait
/// for the next piece). Feeding bytes in any pieces gives the same state;
/// two streams of one length that differ anywhere almost surely differ in
/// it. About a fifth of a nanosecond per byte: a checksum of everything a
/// transaction's client receives costs little beside forwarding it.
#[derive(Debug, Clone, Copy, Eq)]
pub struct Checksum {
    hash: u64,
    len: u64,
    /// The bytes of an unfinished word, and how many.
    pending: [u8; 8],
    npending: usize,
}

impl PartialEq for Checksum {
    /// The same bytes fed: only the unfinished word's own bytes count.
    fn eq(&self, other: &Checksum) -> bool {
        self.hash == other.hash
            && self.len == other.len
            && self.pending[..self.npending] == other.pending[..other.npending]
    }
}

impl Default for Checksum {
    fn default() -> Checksum {
        Checksum {
            hash: 0xcbf2_9ce4_8422_2325,
            len: 0,
            pending: [0; 8],
            npending: 0,
        }
    }
}

impl Checksum {
    #[inline]
    fn mix(hash: u64, word: u64) -> u64 {
        (hash ^ word)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29)
    }

    pub fn feed(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        if self.npending > 0 {
            let take = (8 - self.npending).min(bytes.len());
            self.pending[self.npending..self.npending + take].copy_from_slice(&bytes[..take]);
            self.npending += take;
            bytes = &bytes[take..];
            if self.npending < 8 {
                return;
            }
            self.hash = Self::mix(self.hash, u64::from_le_bytes(self.pending));
            self.npending = 0;
        }
        let mut words = bytes.chunks_exact(8);
        let mut h = self.hash;
        for w in &mut words {
            h = Self::mix(h, u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        self.hash = h;
        let rest = words.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.npending = rest.len();
    }

    /// The bytes of the unfinished word, as a word (0 when none).
    fn pending_word(&self) -> u64 {
        let mut w = [0u8; 8];
        w[..self.npending].copy_from_slice(&self.pending[..self.npending]);
        u64::from_le_bytes(w) ^ (self.npending as u64) << 56
    }

    /// Bytes fed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// How the client's output is framed, and which of its messages are left
/// out of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// PostgreSQL messages (a tag, a 4-byte length): ParameterStatus is
    /// left out (a promoted server reports `in_hot_standby = off` on its
    /// connections; settings are restored on every connection anyway).
    Postgres,
    /// Every byte counts (MySQL: its packets carry nothing that changes
    /// with the server a statement ran on).
    Whole,
}

/// One message of the output as the comparison saw it: its type (the
/// PostgreSQL tag; a MySQL packet's first byte), its length, and a hash
/// of its bytes, so a mismatch can name the first message that differs.
#[derive(Debug, Clone, Copy, Eq)]
pub struct FrameMark {
    pub kind: u8,
    pub len: u32,
    hash: u64,
    /// Where it starts in the stream (its header).
    pub(super) at: u64,
}

impl PartialEq for FrameMark {
    /// The same message: type, length and bytes (not where it stands: a
    /// left-out ParameterStatus before it moves it).
    fn eq(&self, o: &FrameMark) -> bool {
        (self.kind, self.len, self.hash) == (o.kind, o.len, o.hash)
    }
}

impl std::fmt::Display for FrameMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = self.kind;
        if kind.is_ascii_graphic() {
            write!(f, "{}({})", kind as char, self.len)
        } else {
            write!(f, "0x{kind:02x}({})", self.len)
        }
    }
}

/// Messages traced per transaction at most (the rest is still checked,
/// by the running checksum, but not named in a mismatch).
pub(super) const TRACE_MAX: usize = 512;

/// The messages of one stream, in order ([`TRACE_MAX`] at most), and the
/// one being read.
#[derive(Debug, Clone, Default)]
pub(super) struct Trace {
    pub(super) marks: Vec<FrameMark>,
    /// The message being read: its type, length and hash so far.
    kind: u8,
    len: u32,
    sum: Checksum,
    at: u64,
    /// MySQL: the packet header being read, and the body bytes left.
    packet_header: [u8; 4],
    in_packet_header: usize,
    packet_left: u64,
}

impl Trace {
    fn start(&mut self, kind: u8, len: u32, at: u64) {
        self.kind = kind;
        self.len = len;
        self.sum = Checksum::default();
        self.at = at;
    }

    fn end(&mut self) {
        if self.marks.len() < TRACE_MAX {
            self.marks.push(FrameMark {
                kind: self.kind,
                len: self.len,
                hash: self.sum.hash ^ self.sum.pending_word(),
                at: self.at,
            });
        }
    }

    /// MySQL packets: a 4-byte header (3-byte length, sequence id), then
    /// the body, whose first byte is the packet's type.
    /// `pos`: where `bytes` start in the stream.
    fn feed_packets(&mut self, mut bytes: &[u8], mut pos: u64) {
        while !bytes.is_empty() {
            if self.in_packet_header < 4 {
                self.packet_header[self.in_packet_header] = bytes[0];
                self.in_packet_header += 1;
                bytes = &bytes[1..];
                pos += 1;
                if self.in_packet_header == 4 {
                    let h = self.packet_header;
                    let len = u32::from_le_bytes([h[0], h[1], h[2], 0]);
                    let kind = bytes.first().copied().unwrap_or(0);
                    self.start(kind, len, pos - 4);
                    self.sum.feed(&h);
                    self.packet_left = u64::from(len);
                    if len == 0 {
                        self.end();
                        self.in_packet_header = 0;
                    }
                }
                continue;
            }
            if self.len == self.packet_left as u32 && self.sum.len() == 4 {
                // The type byte may come in a later piece than the header.
                self.kind = bytes[0];
            }
            let take = (self.packet_left as usize).min(bytes.len());
            self.sum.feed(&bytes[..take]);
            self.packet_left -= take as u64;
            bytes = &bytes[take..];
            pos += take as u64;
            if self.packet_left == 0 {
                self.end();
                self.in_packet_header = 0;
            }
        }
    }
}

/// Where a frame-aware feed stands in the output stream: inside a frame's
/// 5-byte header or its body, and whether that frame is left out; and the
/// trace of the messages fed.
#[derive(Debug, Clone)]
pub(super) struct Cursor {
    pub(super) framing: Framing,
    header: [u8; 5],
    in_header: usize,
    left: u64,
    skip: bool,
    pub(super) trace: Trace,
    /// Bytes of the stream consumed so far.
    pos: u64,
}

impl Cursor {
    pub(super) fn new(framing: Framing) -> Cursor {
        Cursor {
            framing,
            header: [0; 5],
            in_header: 0,
            left: 0,
            skip: false,
            trace: Trace::default(),
            pos: 0,
        }
    }

    /// Feeds `bytes` to `sum`, leaving out skipped frames, until `sum`
    /// holds `limit` bytes. Returns how many of `bytes` were consumed.
    pub(super) fn feed(&mut self, bytes: &[u8], sum: &mut Checksum, limit: u64) -> usize {
        if self.framing == Framing::Whole {
            let n = (limit.saturating_sub(sum.len()) as usize).min(bytes.len());
            sum.feed(&bytes[..n]);
            self.trace.feed_packets(&bytes[..n], self.pos);
            self.pos += n as u64;
            return n;
        }
        let n = self.feed_frames(bytes, sum, limit);
        self.pos += n as u64;
        n
    }

    fn feed_frames(&mut self, bytes: &[u8], sum: &mut Checksum, limit: u64) -> usize {
        let mut i = 0;
        while i < bytes.len() && sum.len() < limit {
            if self.in_header < 5 {
                let b = bytes[i];
                if self.in_header == 0 {
                    self.skip = b == b'S';
                }
                self.header[self.in_header] = b;
                self.in_header += 1;
                if !self.skip {
                    sum.feed(&[b]);
                }
                i += 1;
                if self.in_header == 5 {
                    let len = u32::from_be_bytes([
                        self.header[1],
                        self.header[2],
                        self.header[3],
                        self.header[4],
                    ]);
                    self.left = (len as u64).saturating_sub(4);
                    if !self.skip {
                        let at = (self.pos + i as u64).saturating_sub(5);
                        self.trace.start(self.header[0], len, at);
                        self.trace.sum.feed(&self.header);
                    }
                    if self.left == 0 {
                        self.in_header = 0;
                        if !self.skip {
                            self.trace.end();
                        }
                    }
                }
                continue;
            }
            let mut take = self.left.min((bytes.len() - i) as u64) as usize;
            if !self.skip {
                take = take.min(limit.saturating_sub(sum.len()) as usize);
                sum.feed(&bytes[i..i + take]);
                self.trace.sum.feed(&bytes[i..i + take]);
            }
            i += take;
            self.left -= take as u64;
            if self.left == 0 {
                self.in_header = 0;
                if !self.skip {
                    self.trace.end();
                }
            }
        }
        i
    }
}
