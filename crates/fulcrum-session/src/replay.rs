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

mod output;

pub use output::{Checksum, FrameMark, Framing};
use output::{Cursor, TRACE_MAX};

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
///
/// With replay off (the default) there is no log: every client's session
/// carries this pointer, not the log's 256 bytes (issue 44, memory per idle
/// client). With replay on, the log is made with the session and kept.
#[derive(Debug)]
pub struct TxnLog(Option<Box<Log>>);

impl TxnLog {
    /// A log keeping up to `max` bytes per transaction; `None` (or 0):
    /// replay off.
    pub fn new(max: Option<u64>, framing: Framing) -> TxnLog {
        let max = max.map_or(0, |m| m.min(usize::MAX as u64) as usize);
        TxnLog((max > 0).then(|| Box::new(Log::new(max, framing))))
    }

    /// Keeps the client's output as well (`transaction_replay_debug`).
    pub fn with_debug(mut self, debug: bool) -> TxnLog {
        if let Some(log) = &mut self.0 {
            log.debug = debug;
        }
        self
    }

    /// Its state, for logs: `closed`, `open`, `spoiled`, `open, not started`.
    pub fn describe(&self) -> &'static str {
        self.0.as_ref().map_or("closed", |log| log.describe())
    }

    pub fn enabled(&self) -> bool {
        self.0.is_some()
    }

    pub fn is_open(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|log| log.state != LogState::Closed)
    }

    /// A unit starts outside a transaction: log from here. `position` is
    /// the client's output position now (what is queued before belongs to
    /// earlier units); `begin`, the deferred `BEGIN` sent ahead of it.
    pub fn open(&mut self, position: u64, begin: Option<String>) {
        if let Some(log) = &mut self.0 {
            log.open(position, begin);
        }
    }

    /// The transaction (or the unit, if it opened none) ended.
    pub fn close(&mut self) {
        if let Some(log) = &mut self.0 {
            log.close();
        }
    }

    /// Not replayable until it closes.
    pub fn spoil(&mut self) {
        if let Some(log) = &mut self.0 {
            log.spoil();
        }
    }

    /// The unit that opened the log starts with a transaction start: if
    /// its server dies before anything completed, it can be sent again
    /// (a first command that completes as something else still spoils it).
    pub fn opens_with_begin(&mut self) {
        if let Some(log) = &mut self.0 {
            log.opens_with_begin = true;
        }
    }

    /// A client message sent to the server in the logged unit.
    pub fn record(&mut self, frame: &[u8]) {
        if let Some(log) = &mut self.0 {
            log.record(frame);
        }
    }

    /// A command completed with tag `began` = it started a transaction.
    /// Only a log whose first command began the transaction is replayable:
    /// anything before it committed on its own, and would run twice.
    pub fn command_done(&mut self, began: bool) {
        if let Some(log) = &mut self.0 {
            log.command_done(began);
        }
    }

    /// Feeds the client's output queued since the last call to the
    /// checksum. `write_buf` is what is still queued, `position` its end
    /// (`Connection::output_position`). Output already written without
    /// being fed (it cannot be checked any more) spoils the log.
    pub fn absorb(&mut self, write_buf: &[u8], position: u64) {
        if let Some(log) = &mut self.0 {
            log.absorb(write_buf, position);
        }
    }

    /// The open transaction can be replayed: logged whole from the
    /// statement that began it.
    pub fn replayable(&self) -> bool {
        self.0.as_ref().is_some_and(|log| log.replayable())
    }

    /// The replay matched: the client's output so far is what it replayed.
    /// (The log was reopened at the replay's start; the replayed output
    /// itself was compared, not absorbed.)
    pub fn replayed(&mut self, replay: &Replay) {
        if let Some(log) = &mut self.0 {
            log.replayed(replay);
        }
    }

    /// Starts a replay of the logged transaction: what to send again and
    /// what the client must be seen to have received. The log starts over
    /// at `position`, so the replayed messages are logged again (a replay
    /// that loses its server too can be replayed once more). With replay
    /// off (never replayable): an empty replay.
    pub fn start_replay(&mut self, position: u64) -> Replay {
        match &mut self.0 {
            Some(log) => log.start_replay(position),
            None => Replay {
                frames: Vec::new(),
                begin: None,
                expected: Checksum::default(),
                expected_trace: Vec::new(),
                got: Checksum::default(),
                cursor: Cursor::new(Framing::Whole),
                debug: None,
            },
        }
    }

    /// Logs the same transaction anew from `position`, for a replay that
    /// starts over: it is known to start with its BEGIN as before.
    pub fn restart(&mut self, position: u64, replay: &Replay, started: bool) {
        if let Some(log) = &mut self.0 {
            log.reopen(position, replay.begin.clone(), started, true);
        }
    }
}

/// The log itself, when replay is on.
#[derive(Debug)]
struct Log {
    /// Most bytes of client messages kept (more than 0).
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

/// The log's steps, as [`TxnLog`]'s of the same names say.
impl Log {
    fn new(max: usize, framing: Framing) -> Log {
        Log {
            max,
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

    fn describe(&self) -> &'static str {
        match (self.state, self.started) {
            (LogState::Closed, _) => "closed",
            (LogState::Spoiled, _) => "spoiled",
            (LogState::Open, false) => "open, its BEGIN not yet answered",
            (LogState::Open, true) => "open",
        }
    }

    fn open(&mut self, position: u64, begin: Option<String>) {
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

    fn close(&mut self) {
        self.state = LogState::Closed;
        self.begin = None;
        self.started = false;
        if self.frames.capacity() > 64 * 1024 {
            self.frames = Vec::new();
        } else {
            self.frames.clear();
        }
    }

    fn spoil(&mut self) {
        if self.state == LogState::Open {
            self.state = LogState::Spoiled;
            self.frames = Vec::new();
        }
    }

    fn record(&mut self, frame: &[u8]) {
        if self.state != LogState::Open {
            return;
        }
        if self.frames.len() + frame.len() > self.max {
            self.spoil();
        } else {
            self.frames.extend_from_slice(frame);
        }
    }

    fn command_done(&mut self, began: bool) {
        if self.state == LogState::Open && !self.started {
            if began {
                self.started = true;
            } else {
                self.spoil();
            }
        }
    }

    fn absorb(&mut self, write_buf: &[u8], position: u64) {
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

    fn replayable(&self) -> bool {
        self.state == LogState::Open && (self.started || self.opens_with_begin)
    }

    fn replayed(&mut self, replay: &Replay) {
        if self.state == LogState::Open {
            self.received = replay.expected;
            self.cursor.trace.marks = replay.expected_trace.clone();
        }
    }

    fn start_replay(&mut self, position: u64) -> Replay {
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
