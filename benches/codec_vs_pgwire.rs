//! Fulcrum's PostgreSQL data path beside pgwire's message codec, on the same
//! bytes: the measured reason the codec is Fulcrum's own (the design card
//! names `pgwire`; docs/architecture.md, "Why the PostgreSQL codec is
//! Fulcrum's own").
//!
//! Each input is handled two ways in one run:
//!
//! - `fulcrum`: what the session does with those bytes, through
//!   `fulcrum_postgres`'s public functions. A server's answer: `check_frame`,
//!   `split_to`, the reply queue's `Expectations::on_server` (a client's
//!   Query is owed), and the frame's bytes appended to the client's buffer
//!   (`server.rs`). A client's unit: `unit_decision` (the routing pass over
//!   the buffered unit: `query_text`, `parse_msg`, `bind_msg`), then each
//!   frame split off and appended to the server's buffer.
//! - `pgwire`: what a proxy built on pgwire's codec does to forward: each
//!   message decoded into pgwire's types (`PgWireBackendMessage::decode` /
//!   `PgWireFrontendMessage::decode`) and encoded again into a buffer.
//!
//! Statement classification is left out of both (the same cost either way;
//! `benches/micro.rs` measures it): the routing pass is given a classifier
//! that answers `Read` without reading the text. The pgwire side does no
//! reply-queue bookkeeping, so its figures are a lower bound.
//!
//! Inputs: pgbench -S's answer (RowDescription, one DataRow,
//! CommandComplete, ReadyForQuery); a 1,000-row answer of 3 text columns
//! (with its RowDescription, CommandComplete and ReadyForQuery); pgbench -S's
//! Query; and the same statement as Parse, Bind, Execute, Sync.
//!
//! ```text
//! cargo bench --bench codec_vs_pgwire -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Each pass refills a kept read buffer with the input and clears a kept
//! write buffer, as a connection does. Before the benchmarks it checks that
//! both sides write the input's bytes back unchanged, prints the heap
//! allocations a steady pass of each makes, and prints whether a Query that
//! is not UTF-8 survives pgwire's decode and encode. `cargo test` does not
//! run it (no `test = true` in Cargo.toml).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use fulcrum_postgres::codec::backend_msg::{command_complete, ready_for_query};
use fulcrum_postgres::codec::check_frame;
use fulcrum_postgres::codec::frame::put_header;
use fulcrum_postgres::codec::frontend_msg::{
    put_bind, put_execute, put_parse, put_query, put_sync,
};
use fulcrum_postgres::frontend::expect::{Expect, Expectations, Step};
use fulcrum_postgres::frontend::statements::ClientStatement;
use fulcrum_postgres::frontend::unit_route::unit_decision;
use fulcrum_sql::Decision;
use pgwire::messages::{DecodeContext, PgWireBackendMessage, PgWireFrontendMessage};

/// The frame size limit Fulcrum's loops are given (as `server.rs`).
const MAX: u64 = u32::MAX as u64;
/// A client's named statements, as the routing pass is given them.
type Statements = HashMap<Vec<u8>, Arc<ClientStatement>>;
/// Rows in the large answer.
const ROWS: usize = 1_000;

// ------------------------------------------------------------------ inputs

/// A RowDescription of `cols` (name, type oid, type size), as PostgreSQL
/// sends it for a table's columns.
fn row_description(out: &mut BytesMut, cols: &[(&str, u32, i16)]) {
    let body = 2 + cols.iter().map(|(n, _, _)| n.len() + 1 + 18).sum::<usize>();
    put_header(out, b'T', body);
    out.put_i16(cols.len() as i16);
    for (i, (name, oid, size)) in cols.iter().enumerate() {
        out.extend_from_slice(name.as_bytes());
        out.put_u8(0);
        out.put_u32(16_397); // the table's oid
        out.put_i16(i as i16 + 1);
        out.put_u32(*oid);
        out.put_i16(*size);
        out.put_i32(-1);
        out.put_i16(0); // text
    }
}

fn data_row(out: &mut BytesMut, values: &[&[u8]]) {
    put_header(
        out,
        b'D',
        2 + values.iter().map(|v| 4 + v.len()).sum::<usize>(),
    );
    out.put_i16(values.len() as i16);
    for v in values {
        out.put_i32(v.len() as i32);
        out.extend_from_slice(v);
    }
}

/// pgbench -S's answer: one int4 column, one row.
fn pgbench_answer() -> BytesMut {
    let mut out = BytesMut::new();
    row_description(&mut out, &[("abalance", 23, 4)]);
    data_row(&mut out, &[b"-2417"]);
    command_complete(&mut out, "SELECT 1");
    ready_for_query(&mut out, b'I');
    out
}

/// `ROWS` rows of an id, a name and a balance, with the answer's frame.
fn rows_answer() -> BytesMut {
    let mut out = BytesMut::new();
    row_description(
        &mut out,
        &[("id", 23, 4), ("name", 25, -1), ("balance", 1700, -1)],
    );
    for i in 0..ROWS {
        let id = i.to_string();
        let name = format!("customer-{i:05}");
        let balance = format!("{}.{:02}", i * 7 % 10_000, i % 100);
        data_row(
            &mut out,
            &[id.as_bytes(), name.as_bytes(), balance.as_bytes()],
        );
    }
    command_complete(&mut out, &format!("SELECT {ROWS}"));
    ready_for_query(&mut out, b'I');
    out
}

const STATEMENT: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = 42";

fn simple_query() -> BytesMut {
    let mut out = BytesMut::new();
    put_query(&mut out, STATEMENT);
    out
}

/// pgbench -S -M extended's unit without its Describe: the unnamed
/// statement with one int4 parameter, bound to text `42`.
fn extended_batch() -> BytesMut {
    let mut out = BytesMut::new();
    let mut definition = b"SELECT abalance FROM pgbench_accounts WHERE aid = $1\0".to_vec();
    definition.extend_from_slice(&1i16.to_be_bytes());
    definition.extend_from_slice(&23u32.to_be_bytes());
    put_parse(&mut out, b"", &definition);
    let mut params = Vec::new();
    params.extend_from_slice(&0i16.to_be_bytes()); // parameter formats: all text
    params.extend_from_slice(&1i16.to_be_bytes());
    params.extend_from_slice(&2i32.to_be_bytes());
    params.extend_from_slice(b"42");
    params.extend_from_slice(&0i16.to_be_bytes()); // result formats: all text
    put_bind(&mut out, b"", b"", &params);
    put_execute(&mut out, b"");
    put_sync(&mut out);
    out
}

// ------------------------------------------------------------ the two sides

/// Fulcrum, server to client: frames split off, accounted by the reply
/// queue, forwarded as they are. Returns the frames forwarded.
fn fulcrum_server(buf: &mut BytesMut, owed: &mut Expectations, out: &mut BytesMut) -> usize {
    owed.push(Expect::Query(Vec::new(), None));
    let mut frames = 0;
    while let Ok(Some(h)) = check_frame(buf, MAX) {
        if buf.len() < h.total {
            break;
        }
        let frame = buf.split_to(h.total);
        let (step, fx) = owed.on_server(h.tag, &frame[5..]);
        black_box(&fx);
        if step == Step::Forward {
            out.extend_from_slice(&frame);
            frames += 1;
        }
    }
    frames
}

/// Fulcrum, client to server: the unit's route read from the buffered
/// frames, then each frame forwarded as it is. Returns the frames forwarded.
fn fulcrum_client(buf: &mut BytesMut, statements: &Statements, out: &mut BytesMut) -> usize {
    let classify = |_: &[u8]| Decision::Read;
    let decision = unit_decision(buf, MAX, &classify, statements, Decision::Write);
    black_box(decision);
    let mut frames = 0;
    while let Ok(Some(h)) = check_frame(buf, MAX) {
        if buf.len() < h.total {
            break;
        }
        let frame = buf.split_to(h.total);
        out.extend_from_slice(&frame);
        frames += 1;
    }
    frames
}

/// A proxy on pgwire's codec, server to client: decode, encode.
fn pgwire_server(buf: &mut BytesMut, ctx: &DecodeContext, out: &mut BytesMut) -> usize {
    let mut frames = 0;
    while let Some(msg) = PgWireBackendMessage::decode(buf, ctx).expect("valid answer") {
        msg.encode(out).expect("encodes");
        frames += 1;
    }
    frames
}

/// A proxy on pgwire's codec, client to server: decode (the query text and
/// statement names are then fields to read), encode.
fn pgwire_client(buf: &mut BytesMut, ctx: &DecodeContext, out: &mut BytesMut) -> usize {
    let mut frames = 0;
    while let Some(msg) = PgWireFrontendMessage::decode(buf, ctx).expect("valid unit") {
        black_box(&msg);
        msg.encode(out).expect("encodes");
        frames += 1;
    }
    frames
}

/// A context past startup: regular tagged messages from either side.
fn frontend_context() -> DecodeContext {
    let mut ctx = DecodeContext::default();
    ctx.awaiting_frontend_ssl = false;
    ctx.awaiting_frontend_startup = false;
    ctx
}

// -------------------------------------------------------- allocation count

/// The system allocator, counting allocations while `COUNTING` is set.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap allocations (and reallocations) `f` makes.
fn allocations(f: impl FnOnce()) -> usize {
    ALLOCS.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    f();
    COUNTING.store(false, Ordering::Relaxed);
    ALLOCS.load(Ordering::Relaxed)
}

// ------------------------------------------------------------- benchmarks

/// One pass as a connection makes it: the input arrives in the read buffer
/// (kept between passes, as a connection's is, so a steady pass allocates
/// nothing of its own), is handled, and leaves in the write buffer
/// (cleared, not reallocated).
fn pass(
    read: &mut BytesMut,
    write: &mut BytesMut,
    input: &[u8],
    side: &mut impl FnMut(&mut BytesMut, &mut BytesMut) -> usize,
) -> usize {
    read.extend_from_slice(input);
    write.clear();
    side(read, write)
}

/// Checks that `side` forwards every message of `input` byte for byte, and
/// returns the heap allocations a steady pass makes (after one pass that
/// lets the buffers and the reply queue grow).
fn check(
    what: &str,
    input: &[u8],
    messages: usize,
    side: &mut impl FnMut(&mut BytesMut, &mut BytesMut) -> usize,
) -> usize {
    let (mut read, mut write) = (BytesMut::new(), BytesMut::new());
    pass(&mut read, &mut write, input, side);
    let mut forwarded = 0;
    let allocs = allocations(|| forwarded = pass(&mut read, &mut write, input, side));
    assert_eq!(forwarded, messages, "{what}: messages forwarded");
    assert_eq!(&write[..], input, "{what}: the bytes forwarded");
    allocs
}

/// Both sides on one input: the check, then the two benchmarks.
fn compare(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    input: &[u8],
    messages: usize,
    mut fulcrum: impl FnMut(&mut BytesMut, &mut BytesMut) -> usize,
    mut pgwire: impl FnMut(&mut BytesMut, &mut BytesMut) -> usize,
) {
    let f = check(&format!("{name}/fulcrum"), input, messages, &mut fulcrum);
    let p = check(&format!("{name}/pgwire"), input, messages, &mut pgwire);
    println!("allocations per pass, {name} ({messages} messages): fulcrum {f}, pgwire {p}");
    g.throughput(Throughput::Elements(messages as u64));
    let (mut read, mut write) = (BytesMut::new(), BytesMut::new());
    g.bench_function(format!("{name}/fulcrum"), |b| {
        b.iter(|| pass(&mut read, &mut write, black_box(input), &mut fulcrum))
    });
    g.bench_function(format!("{name}/pgwire"), |b| {
        b.iter(|| pass(&mut read, &mut write, black_box(input), &mut pgwire))
    });
}

fn bench_codecs(c: &mut Criterion) {
    let backend_ctx = DecodeContext::default();
    let frontend_ctx = frontend_context();
    let statements = Statements::new();
    let mut owed = Expectations::default();
    not_utf8_query(&frontend_ctx);

    let mut g = c.benchmark_group("codec_vs_pgwire");
    for (name, input, messages) in [
        ("pgbench_answer", pgbench_answer(), 4),
        ("rows_1000x3", rows_answer(), ROWS + 3),
    ] {
        compare(
            &mut g,
            name,
            &input,
            messages,
            |read, write| fulcrum_server(read, &mut owed, write),
            |read, write| pgwire_server(read, &backend_ctx, write),
        );
    }
    for (name, input, messages) in [
        ("query", simple_query(), 1),
        ("parse_bind_execute_sync", extended_batch(), 4),
    ] {
        compare(
            &mut g,
            name,
            &input,
            messages,
            |read, write| fulcrum_client(read, &statements, write),
            |read, write| pgwire_client(read, &frontend_ctx, write),
        );
    }
    g.finish();
}

/// A Query in a client encoding that is not UTF-8 (LATIN1 `é` is one byte,
/// 0xE9): Fulcrum forwards its bytes; printed is whether pgwire's decode
/// and encode give the same bytes back.
fn not_utf8_query(ctx: &DecodeContext) {
    let body = b"SELECT * FROM t WHERE n = '\xe9'\0";
    let mut input = BytesMut::new();
    put_header(&mut input, b'Q', body.len());
    input.extend_from_slice(body);
    assert_eq!(
        check_frame(&input, MAX).unwrap().unwrap().total,
        input.len()
    );
    let mut out = BytesMut::new();
    pgwire_client(&mut input.clone(), ctx, &mut out);
    println!(
        "LATIN1 Query through pgwire: {} bytes in, {} bytes out, unchanged: {}",
        input.len(),
        out.len(),
        out == input
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().without_plots();
    targets = bench_codecs
}
criterion_main!(benches);
