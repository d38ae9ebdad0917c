//! Transaction replay (`transaction_replay`): the bounded copy of an open
//! transaction's client messages ([`TxnLog`]), the checksum of what the
//! client has received in it, and the comparison a replay makes on the new
//! primary ([`Replay`]). Protocol neutral and pure: the front ends hand in
//! client frames, the tags of completed commands and their output buffer;
//! they do the sending and the waiting.
//!
//! What the client received is checked byte for byte, as a running checksum
//! over everything queued for it since the transaction's first unit, so a
//! replay is accepted only when the new primary answers every statement the
//! client already saw exactly as the dead one did (rows, command tags,
//! errors, notices). The answers past that point (the statement that was in
//! flight) then go to the client as they come.

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
    at: u64,
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
const TRACE_MAX: usize = 512;

/// The messages of one stream, in order ([`TRACE_MAX`] at most), and the
/// one being read.
#[derive(Debug, Clone, Default)]
struct Trace {
    marks: Vec<FrameMark>,
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
struct Cursor {
    framing: Framing,
    header: [u8; 5],
    in_header: usize,
    left: u64,
    skip: bool,
    trace: Trace,
    /// Bytes of the stream consumed so far.
    pos: u64,
}

impl Cursor {
    fn new(framing: Framing) -> Cursor {
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
    fn feed(&mut self, bytes: &[u8], sum: &mut Checksum, limit: u64) -> usize {
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

/// Where a transaction's log stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogState {
    /// No unit is being logged (between transactions, or replay is off).
    Closed,
    /// Logging the unit (or transaction) that started at the open.
    Open,
    /// Open, but the transaction cannot be replayed (too large, COPY, a
    /// statement ran before its BEGIN, ...): nothing is kept until it ends.
    Spoiled,
}

/// The copy of one client's open transaction: its client messages as sent,
/// the `BEGIN` Fulcrum sent ahead of them (a deferred one), and the
/// checksum of the client's output since the first of them.
#[derive(Debug)]
pub struct TxnLog {
    /// Most bytes of client messages kept (0: replay is off).
    max: usize,
    state: LogState,
    frames: Vec<u8>,
    begin: Option<String>,
    /// The first command completed was the transaction's start.
    started: bool,
    /// The unit that opened the log begins with `BEGIN` (its first
    /// statement may still be in flight: no command completed yet).
    opens_with_begin: bool,
    received: Checksum,
    cursor: Cursor,
    /// Output position (`Connection::output_position`) up to which the
    /// client's output has been fed to `received`.
    absorbed: u64,
    /// `transaction_replay_debug`: the client's output itself is kept too
    /// (up to `max`), so a mismatch can show the bytes that differ.
    debug: bool,
    output: Vec<u8>,
}

impl TxnLog {
    /// A log keeping up to `max` bytes per transaction; `None`: replay off.
    pub fn new(max: Option<u64>, framing: Framing) -> TxnLog {
        TxnLog {
            max: max.map_or(0, |m| m.min(usize::MAX as u64) as usize),
            state: LogState::Closed,
            frames: Vec::new(),
            begin: None,
            started: false,
            opens_with_begin: false,
            received: Checksum::default(),
            cursor: Cursor::new(framing),
            absorbed: 0,
            debug: false,
            output: Vec::new(),
        }
    }

    /// Keeps the client's output as well (`transaction_replay_debug`).
    pub fn with_debug(mut self, debug: bool) -> TxnLog {
        self.debug = debug;
        self
    }

    /// Its state, for logs: `closed`, `open`, `spoiled`, `open, not started`.
    pub fn describe(&self) -> &'static str {
        match (self.state, self.started) {
            (LogState::Closed, _) => "closed",
            (LogState::Spoiled, _) => "spoiled",
            (LogState::Open, false) => "open, its BEGIN not yet answered",
            (LogState::Open, true) => "open",
        }
    }

    pub fn enabled(&self) -> bool {
        self.max > 0
    }

    pub fn is_open(&self) -> bool {
        self.state != LogState::Closed
    }

    /// A unit starts outside a transaction: log from here. `position` is
    /// the client's output position now (what is queued before belongs to
    /// earlier units); `begin`, the deferred `BEGIN` sent ahead of it.
    pub fn open(&mut self, position: u64, begin: Option<String>) {
        if !self.enabled() {
            return;
        }
        self.state = LogState::Open;
        self.frames.clear();
        self.started = begin.is_some();
        self.opens_with_begin = false;
        self.begin = begin;
        self.received = Checksum::default();
        self.cursor = Cursor::new(self.cursor.framing);
        self.absorbed = position;
        self.output.clear();
    }

    /// The transaction (or the unit, if it opened none) ended.
    pub fn close(&mut self) {
        self.state = LogState::Closed;
        self.begin = None;
        self.started = false;
        if self.frames.capacity() > 64 * 1024 {
            self.frames = Vec::new();
        } else {
            self.frames.clear();
        }
    }

    /// Not replayable until it closes.
    pub fn spoil(&mut self) {
        if self.state == LogState::Open {
            self.state = LogState::Spoiled;
            self.frames = Vec::new();
        }
    }

    /// The unit that opened the log starts with a transaction start: if
    /// its server dies before anything completed, it can be sent again
    /// (a first command that completes as something else still spoils it).
    pub fn opens_with_begin(&mut self) {
        self.opens_with_begin = true;
    }

    /// A client message sent to the server in the logged unit.
    pub fn record(&mut self, frame: &[u8]) {
        if self.state != LogState::Open {
            return;
        }
        if self.frames.len() + frame.len() > self.max {
            self.spoil();
        } else {
            self.frames.extend_from_slice(frame);
        }
    }

    /// A command completed with tag `began` = it started a transaction.
    /// Only a log whose first command began the transaction is replayable:
    /// anything before it committed on its own, and would run twice.
    pub fn command_done(&mut self, began: bool) {
        if self.state == LogState::Open && !self.started {
            if began {
                self.started = true;
            } else {
                self.spoil();
            }
        }
    }

    /// Feeds the client's output queued since the last call to the
    /// checksum. `write_buf` is what is still queued, `position` its end
    /// (`Connection::output_position`). Output already written without
    /// being fed (it cannot be checked any more) spoils the log.
    pub fn absorb(&mut self, write_buf: &[u8], position: u64) {
        if self.state != LogState::Open {
            self.absorbed = position;
            return;
        }
        let new = position.saturating_sub(self.absorbed);
        if new > write_buf.len() as u64 {
            self.spoil();
        } else if new > 0 {
            let out = &write_buf[write_buf.len() - new as usize..];
            self.cursor.feed(out, &mut self.received, u64::MAX);
            if self.debug && self.output.len() + out.len() <= self.max {
                self.output.extend_from_slice(out);
            }
        }
        self.absorbed = position;
    }

    /// The open transaction can be replayed: logged whole from the
    /// statement that began it.
    pub fn replayable(&self) -> bool {
        self.state == LogState::Open && (self.started || self.opens_with_begin)
    }

    /// The replay matched: the client's output so far is what it replayed.
    /// (The log was reopened at the replay's start; the replayed output
    /// itself was compared, not absorbed.)
    pub fn replayed(&mut self, replay: &Replay) {
        if self.state == LogState::Open {
            self.received = replay.expected;
            self.cursor.trace.marks = replay.expected_trace.clone();
        }
    }

    /// Starts a replay of the logged transaction: what to send again and
    /// what the client must be seen to have received. The log starts over
    /// at `position`, so the replayed messages are logged again (a replay
    /// that loses its server too can be replayed once more).
    pub fn start_replay(&mut self, position: u64) -> Replay {
        let replay = Replay {
            frames: std::mem::take(&mut self.frames),
            begin: self.begin.clone(),
            expected: self.received,
            expected_trace: std::mem::take(&mut self.cursor.trace.marks),
            got: Checksum::default(),
            cursor: Cursor::new(self.cursor.framing),
            debug: self
                .debug
                .then(|| (std::mem::take(&mut self.output), Vec::new())),
        };
        let (started, opens_with_begin) = (self.started, self.opens_with_begin);
        let begin = self.begin.take();
        self.reopen(position, begin, started, opens_with_begin);
        replay
    }

    /// Logs the same transaction anew from `position`, for a replay that
    /// starts over: it is known to start with its BEGIN as before.
    pub fn restart(&mut self, position: u64, replay: &Replay, started: bool) {
        self.reopen(position, replay.begin.clone(), started, true);
    }

    fn reopen(&mut self, position: u64, begin: Option<String>, started: bool, with_begin: bool) {
        self.open(position, begin);
        self.started |= started;
        self.opens_with_begin = with_begin;
    }
}

/// A replay under way: the transaction's messages, its deferred `BEGIN`,
/// the checksum of what the client received, and that of the replayed
/// output so far.
#[derive(Debug, Clone)]
pub struct Replay {
    pub frames: Vec<u8>,
    pub begin: Option<String>,
    pub expected: Checksum,
    /// The messages the client received, as traced.
    expected_trace: Vec<FrameMark>,
    got: Checksum,
    cursor: Cursor,
    /// `transaction_replay_debug`: the output the client received and the
    /// replayed output compared so far.
    debug: Option<(Vec<u8>, Vec<u8>)>,
}

/// How the replayed output compares with what the client received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// Matching so far; more is needed. All of the output was taken.
    More,
    /// All the client had received was replayed identically: the first
    /// `taken` bytes of the output were replayed ones, the rest is new and
    /// goes to the client.
    Matched { taken: usize },
    /// The replayed answers differ from what the client received.
    Differs,
}

impl Replay {
    /// Takes the replayed output `out` (output queued for the client since
    /// the replay started, not yet compared) up to the length the client
    /// had received, and compares once that length is reached.
    pub fn compare(&mut self, out: &[u8]) -> Compare {
        let taken = self.cursor.feed(out, &mut self.got, self.expected.len());
        if let Some((_, got)) = &mut self.debug {
            got.extend_from_slice(&out[..taken]);
        }
        if self.got.len() < self.expected.len() {
            Compare::More
        } else if self.got == self.expected {
            Compare::Matched { taken }
        } else {
            Compare::Differs
        }
    }

    /// The replayed output stopped short of what the client received (the
    /// new primary owes nothing more): the answers differ.
    pub fn is_short(&self) -> bool {
        self.got.len() < self.expected.len()
    }

    /// The first message that differs (0-based), by the traces.
    fn first_difference(&self) -> usize {
        let (want, got) = (&self.expected_trace, &self.cursor.trace.marks);
        want.iter()
            .zip(got.iter())
            .position(|(a, b)| a != b)
            .unwrap_or(want.len().min(got.len()))
    }

    /// How many statements had completed before the first message that
    /// differs (`completes`: the message types that end one), to name the
    /// statement that produced it.
    pub fn completed_before_difference(&self, completes: impl Fn(u8) -> bool) -> usize {
        let at = self.first_difference();
        self.expected_trace[..at.min(self.expected_trace.len())]
            .iter()
            .filter(|m| completes(m.kind))
            .count()
    }

    /// Where the replayed messages part from what the client received:
    /// `expected D(12) C(13), got D(12) E(97) at message 7 of 9` (the
    /// differing message, with two before it and one after).
    pub fn difference(&self) -> String {
        let (want, got) = (&self.expected_trace, &self.cursor.trace.marks);
        let at = self.first_difference();
        let from = at.saturating_sub(2);
        let show = |marks: &[FrameMark]| {
            let shown: Vec<String> = marks
                .iter()
                .skip(from)
                .take(at + 2 - from)
                .map(ToString::to_string)
                .collect();
            if shown.is_empty() {
                "nothing".to_owned()
            } else {
                shown.join(" ")
            }
        };
        let note = if want.len() >= TRACE_MAX {
            format!(" (messages past the first {TRACE_MAX} are not traced)")
        } else {
            String::new()
        };
        let mut text = format!(
            "expected {}, got {} at message {} of {}{note}",
            show(want),
            show(got),
            at + 1,
            want.len()
        );
        if let Some((want_bytes, got_bytes)) = &self.debug {
            // A message's whole size: its length and what precedes it
            // (PostgreSQL: the tag; MySQL: the 4-byte header, not counted).
            let header = match self.cursor.framing {
                Framing::Postgres => 1,
                Framing::Whole => 4,
            };
            let bytes = |marks: &[FrameMark], stream: &[u8]| -> String {
                marks.get(at).map_or("none".to_owned(), |m| {
                    let from = (m.at as usize).min(stream.len());
                    let to = ((m.at + header + u64::from(m.len)) as usize).min(stream.len());
                    format!("\"{}\"", stream[from..to].escape_ascii())
                })
            };
            text.push_str(&format!(
                "; the message received: {}, replayed: {}",
                bytes(want, want_bytes),
                bytes(got, got_bytes)
            ));
        }
        text
    }

    /// Starts the comparison over (the replay's own server was lost).
    pub fn restart(&mut self) {
        self.got = Checksum::default();
        self.cursor = Cursor::new(self.cursor.framing);
        if let Some((_, got)) = &mut self.debug {
            got.clear();
        }
    }
}

#[cfg(test)]
#[path = "replay/tests.rs"]
mod tests;
