//! Driver (d): the tokio driver's task, unchanged in shape, on a minimal
//! executor of our own whose reactor is one `mio::Poll`. The question it
//! answers: can an `async` session keep its shape and cost about what a
//! plain mio loop does (`mio_loop.rs`), or is tokio's floor the price of
//! `async` itself?
//!
//! - **Executor**: one thread; tasks are `Pin<Box<dyn Future<Output = ()>>>`
//!   in a slab. A task's `Waker` is a pointer to its slot's header (slot
//!   index and the executor's shared part), leaked once per slot and reused
//!   by the slot's later tasks, so cloning and dropping a waker do nothing
//!   and a stale waker at worst polls a later task once, spuriously. Waking
//!   on the executor's thread (told by a `const` thread-local holding the
//!   running executor's address) pushes the index on a plain ready queue,
//!   unless the task is queued already; from another thread it goes through
//!   a `Mutex<Vec>` and a `mio::Waker` (never, in this bench, but it keeps
//!   `Waker`'s `Send + Sync` honest).
//! - **Reactor**: every socket is registered edge-triggered for reading and
//!   writing once, with a slot of readiness bits and the waker of the task
//!   waiting on it. A read or write is tried first; `WouldBlock` clears the
//!   bit (and a short read does too, with `short`), and a task that must
//!   wait stores its waker. An event sets the bits and wakes that waker.
//! - **Loop**: run ready tasks until none are left, then `poll` with no
//!   timeout; the listener is accepted from in the loop itself (a task per
//!   client is spawned), each task opens its server connection with an
//!   asynchronous connect, as `tokio_loop.rs`'s does.
//! - **Deadlines** (with `idle`, the `exec-mio-deadline` driver): no timer
//!   per task and no clock read per wait. A timerfd in the same `Poll`
//!   counts seconds into a tick; a waiting task stores `tick + idle` in its
//!   client's slot and gives up when the tick reaches it; once a tick the
//!   loop sweeps the slots and wakes the tasks past their deadline.
//!
//! The executor lives for the process (the bench runs until killed), which
//! is what lets wakers point at leaked headers without counting references.

use std::cell::{Cell, RefCell, UnsafeCell};
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Mutex;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Registry, Token};

use crate::BUF;

/// The listener's token.
const LISTENER: Token = Token(0);
/// The `mio::Waker`'s token, for wakes from other threads.
const REMOTE: Token = Token(1);
/// The deadline tick's timerfd's token.
const TICK: Token = Token(2);
/// Reactor slot `i` has token `FIRST + i`.
const FIRST: usize = 3;

type Task = Pin<Box<dyn Future<Output = ()>>>;

thread_local! {
    /// The address of the `Shared` of the executor running on this thread
    /// (0 if none): a wake from this thread may use its local queue.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// What wakers reach: the local queue, and the path from other threads.
struct Shared {
    /// Touched only on the thread whose `CURRENT` holds this `Shared`.
    local: UnsafeCell<Local>,
    remote: Mutex<Vec<usize>>,
    remote_waker: mio::Waker,
}

// SAFETY: `local` is only accessed by `wake` on the thread that runs the
// executor (checked against `CURRENT`) and by the executor itself, and the
// executor is `!Send` (it holds an `Rc`); `remote` is a `Mutex`, and
// `mio::Waker` is `Sync`.
unsafe impl Sync for Shared {}

/// The ready queue and, per slot, whether the slot's task is on it.
struct Local {
    ready: VecDeque<usize>,
    queued: Vec<bool>,
}

/// What a task's `Waker` points at; one per slot, never freed.
struct Header {
    index: usize,
    shared: &'static Shared,
}

impl Shared {
    fn wake(&'static self, index: usize) {
        if CURRENT.get() == self as *const Shared as usize {
            // SAFETY: on the executor's thread (see `Sync` above), and no
            // reference into `local` is held across a task's poll.
            let local = unsafe { &mut *self.local.get() };
            if !local.queued[index] {
                local.queued[index] = true;
                local.ready.push_back(index);
            }
        } else {
            self.remote.lock().unwrap().push(index);
            let _ = self.remote_waker.wake();
        }
    }

    /// Pops the next ready task, marking it no longer queued (a wake while
    /// it is polled queues it again).
    fn pop(&self) -> Option<usize> {
        // SAFETY: called by the executor, on its thread, holding nothing.
        let local = unsafe { &mut *self.local.get() };
        let index = local.ready.pop_front()?;
        local.queued[index] = false;
        Some(index)
    }
}

static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake, forget);

unsafe fn clone(header: *const ()) -> RawWaker {
    RawWaker::new(header, &VTABLE)
}

unsafe fn wake(header: *const ()) {
    // SAFETY: every waker with this vtable points at a leaked `Header`.
    let header = unsafe { &*(header as *const Header) };
    header.shared.wake(header.index);
}

unsafe fn forget(_: *const ()) {}

/// The slab of tasks and their wakers.
struct Executor {
    shared: &'static Shared,
    tasks: Vec<Option<Task>>,
    wakers: Vec<Waker>,
    free: Vec<usize>,
}

impl Executor {
    fn new(remote_waker: mio::Waker) -> Executor {
        let shared = Box::leak(Box::new(Shared {
            local: UnsafeCell::new(Local {
                ready: VecDeque::new(),
                queued: Vec::new(),
            }),
            remote: Mutex::new(Vec::new()),
            remote_waker,
        }));
        CURRENT.set(shared as *const Shared as usize);
        Executor {
            shared,
            tasks: Vec::new(),
            wakers: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Puts a task in a free slot and queues it for its first poll.
    fn spawn(&mut self, task: impl Future<Output = ()> + 'static) {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let index = self.tasks.len();
                let header: &'static Header = Box::leak(Box::new(Header {
                    index,
                    shared: self.shared,
                }));
                let raw = RawWaker::new(header as *const Header as *const (), &VTABLE);
                // SAFETY: the vtable's functions uphold `RawWaker`'s
                // contract: the header is never freed, and `wake` is safe
                // from any thread (`Shared::wake`).
                self.wakers.push(unsafe { Waker::from_raw(raw) });
                self.tasks.push(None);
                // SAFETY: on the executor's thread, holding nothing.
                unsafe { &mut *self.shared.local.get() }.queued.push(false);
                index
            }
        };
        self.tasks[index] = Some(Box::pin(task));
        self.shared.wake(index);
    }

    /// Polls ready tasks until none is left.
    fn run_ready(&mut self) {
        while let Some(index) = self.shared.pop() {
            let Some(task) = self.tasks[index].as_mut() else {
                continue; // a stale wake of a finished task
            };
            let mut cx = Context::from_waker(&self.wakers[index]);
            if task.as_mut().poll(&mut cx).is_ready() {
                self.tasks[index] = None;
                self.free.push(index);
            }
        }
    }

    /// Queues what other threads woke.
    fn take_remote(&self) {
        let woken = std::mem::take(&mut *self.shared.remote.lock().unwrap());
        for index in woken {
            self.shared.wake(index);
        }
    }
}

/// One socket's readiness, as the reactor last learnt it, and the waker of
/// the task waiting on it: set by the reactor, read and cleared by the
/// socket's `Io`, which holds it directly (no table look-up, no borrow).
#[derive(Default)]
struct Slot {
    readable: Cell<bool>,
    writable: Cell<bool>,
    waker: Cell<Option<Waker>>,
    /// The tick at which the waiting task gives up (0: none).
    deadline: Cell<u64>,
}

impl Slot {
    /// Stores the task's waker unless the same one is there.
    fn store(&self, cx: &Context<'_>) {
        match self.waker.take() {
            Some(waker) if waker.will_wake(cx.waker()) => self.waker.set(Some(waker)),
            _ => self.waker.set(Some(cx.waker().clone())),
        }
    }
}

/// The sockets' slots by token, filled from the loop's `mio::Poll`.
struct Reactor {
    registry: Registry,
    slots: RefCell<Vec<Rc<Slot>>>,
    free: RefCell<Vec<usize>>,
    /// Seconds since the start, counted by the loop's timerfd.
    tick: Cell<u64>,
}

impl Reactor {
    /// Registers a socket edge-triggered for reading and writing, once.
    fn register(self: &Rc<Reactor>, mut sock: TcpStream) -> io::Result<Io> {
        let index = match self.free.borrow_mut().pop() {
            Some(index) => index,
            None => {
                let mut slots = self.slots.borrow_mut();
                slots.push(Rc::default());
                slots.len() - 1
            }
        };
        let both = Interest::READABLE | Interest::WRITABLE;
        if let Err(e) = self
            .registry
            .register(&mut sock, Token(FIRST + index), both)
        {
            self.free.borrow_mut().push(index);
            return Err(e);
        }
        Ok(Io {
            sock,
            index,
            slot: Rc::clone(&self.slots.borrow()[index]),
            reactor: Rc::clone(self),
        })
    }

    /// Records an event's readiness and wakes the task waiting, if any.
    fn dispatch(&self, event: &Event) {
        let slots = self.slots.borrow();
        let Some(slot) = slots.get(event.token().0 - FIRST) else {
            return;
        };
        if event.is_readable() || event.is_read_closed() || event.is_error() {
            slot.readable.set(true);
        }
        if event.is_writable() || event.is_write_closed() || event.is_error() {
            slot.writable.set(true);
        }
        if let Some(waker) = slot.waker.take() {
            waker.wake(); // only queues the task
        }
    }

    /// Wakes every task whose deadline has passed: the per-worker sweep,
    /// once a tick, instead of a timer per task.
    fn sweep(&self) {
        let tick = self.tick.get();
        for slot in self.slots.borrow().iter() {
            let deadline = slot.deadline.get();
            if deadline != 0 && deadline <= tick {
                if let Some(waker) = slot.waker.take() {
                    waker.wake();
                }
            }
        }
    }
}

/// A socket registered with the reactor.
struct Io {
    sock: TcpStream,
    index: usize,
    slot: Rc<Slot>,
    reactor: Rc<Reactor>,
}

impl Io {
    /// Ready if the socket was readable when last seen; otherwise stores
    /// the waker for the next event.
    #[inline]
    fn poll_readable(&self, cx: &Context<'_>) -> bool {
        if self.slot.readable.get() {
            return true;
        }
        self.slot.store(cx);
        false
    }

    /// Ready if the socket was writable when last seen, as `poll_readable`.
    #[inline]
    fn poll_writable(&self, cx: &Context<'_>) -> bool {
        if self.slot.writable.get() {
            return true;
        }
        self.slot.store(cx);
        false
    }

    /// One `read`, at once. `WouldBlock` clears the readable bit; with
    /// `short`, so does a read shorter than `buf` (the module's doc).
    #[inline]
    fn try_read(&self, buf: &mut [u8], short: bool) -> io::Result<usize> {
        match (&self.sock).read(buf) {
            Ok(n) if short && n > 0 && n < buf.len() => {
                self.slot.readable.set(false);
                Ok(n)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.slot.readable.set(false);
                Err(e)
            }
            read => read,
        }
    }

    /// One `write`, at once; `WouldBlock` clears the writable bit (the
    /// caller then waits with `poll_writable`).
    #[inline]
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        match (&self.sock).write(bytes) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.slot.writable.set(false);
                Err(e)
            }
            written => written,
        }
    }
}

impl Drop for Io {
    fn drop(&mut self) {
        let _ = self.reactor.registry.deregister(&mut self.sock);
        self.slot.readable.set(false);
        self.slot.writable.set(false);
        self.slot.waker.take();
        self.slot.deadline.set(0);
        self.reactor.free.borrow_mut().push(self.index);
    }
}

/// Waits until `io` is writable (last seen so).
async fn writable(io: &Io) {
    poll_fn(|cx| {
        if io.poll_writable(cx) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// A timerfd that expires once a second, non-blocking.
fn ticker() -> io::Result<OwnedFd> {
    // SAFETY: plain system calls; the descriptor is owned at once.
    unsafe {
        let fd = libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let second = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        let spec = libc::itimerspec {
            it_interval: second,
            it_value: second,
        };
        if libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }
}

/// The expirations a timerfd counted since it was last read (0 when none).
fn expirations(fd: &OwnedFd) -> u64 {
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into a `u64`, from a descriptor we own.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    if n == 8 {
        count
    } else {
        0
    }
}

/// Runs the forwarder until the process is killed. `idle`: seconds a
/// client may stay silent (its task waits with a deadline), or none.
pub fn run(
    listen: SocketAddr,
    server: SocketAddr,
    short: bool,
    idle: Option<u64>,
) -> io::Result<()> {
    let mut poll = mio::Poll::new()?;
    let mut executor = Executor::new(mio::Waker::new(poll.registry(), REMOTE)?);
    let reactor = Rc::new(Reactor {
        registry: poll.registry().try_clone()?,
        slots: RefCell::new(Vec::new()),
        free: RefCell::new(Vec::new()),
        tick: Cell::new(1),
    });
    let mut listener = TcpListener::bind(listen)?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let tick = match idle {
        Some(_) => Some(ticker()?),
        None => None,
    };
    if let Some(fd) = &tick {
        let raw = fd.as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&raw), TICK, Interest::READABLE)?;
    }
    let mut events = Events::with_capacity(1024);
    loop {
        executor.run_ready();
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for event in events.iter() {
            match event.token() {
                LISTENER => loop {
                    let client = match listener.accept() {
                        Ok((client, _)) => client,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    };
                    // A client the reactor cannot take is simply closed.
                    let Ok(client) = reactor.register(client) else {
                        continue;
                    };
                    let reactor = Rc::clone(&reactor);
                    executor.spawn(async move {
                        // A client whose server cannot be reached, or a
                        // pair one of whose sides failed, is simply closed.
                        let _ = pair(client, reactor, server, short, idle).await;
                    });
                },
                REMOTE => executor.take_remote(),
                TICK => {
                    if let Some(fd) = &tick {
                        // Edge-triggered: read until nothing is counted.
                        loop {
                            let n = expirations(fd);
                            if n == 0 {
                                break;
                            }
                            reactor.tick.set(reactor.tick.get() + n);
                        }
                        reactor.sweep();
                    }
                }
                _ => reactor.dispatch(event),
            }
        }
    }
}

/// Opens a connection without blocking: registered at once, ready when
/// writable and connected.
async fn connect(reactor: &Rc<Reactor>, addr: SocketAddr) -> io::Result<Io> {
    let io = reactor.register(TcpStream::connect(addr)?)?;
    loop {
        writable(&io).await;
        if let Some(e) = io.sock.take_error()? {
            return Err(e);
        }
        match io.sock.peer_addr() {
            Ok(_) => return Ok(io),
            Err(e) if e.kind() == ErrorKind::NotConnected => {
                io.slot.writable.set(false);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Forwards between one client and its own server connection until either
/// side closes: `tokio_loop.rs`'s task, on this executor. With `idle`, each
/// wait has a deadline: a client silent for that long is closed.
async fn pair(
    client: Io,
    reactor: Rc<Reactor>,
    server: SocketAddr,
    short: bool,
    idle: Option<u64>,
) -> io::Result<()> {
    let server = connect(&reactor, server).await?;
    client.sock.set_nodelay(true)?;
    server.sock.set_nodelay(true)?;
    let mut to_server = vec![0u8; BUF];
    let mut to_client = vec![0u8; BUF];
    loop {
        // The sweep wakes the waker stored in the client's slot.
        let deadline = idle.map_or(0, |idle| reactor.tick.get() + idle);
        if deadline != 0 {
            client.slot.deadline.set(deadline);
        }
        // Both sockets polled in one future: the task is woken by whichever
        // turns readable first (or by the sweep, past the deadline).
        let (from_client, from_server) = poll_fn(|cx| {
            let c = client.poll_readable(cx);
            let s = server.poll_readable(cx);
            if c || s {
                Poll::Ready((c, s))
            } else if deadline != 0 && reactor.tick.get() >= deadline {
                Poll::Ready((false, false))
            } else {
                Poll::Pending
            }
        })
        .await;
        if !from_client && !from_server {
            return Err(ErrorKind::TimedOut.into());
        }
        if from_client && !pump(&client, &server, &mut to_server, short).await? {
            return Ok(());
        }
        if from_server && !pump(&server, &client, &mut to_client, short).await? {
            return Ok(());
        }
    }
}

/// Reads `from` until `WouldBlock` (or, with `short`, a short read),
/// writing each read to `to` at once. False when `from` has closed.
async fn pump(from: &Io, to: &Io, buf: &mut [u8], short: bool) -> io::Result<bool> {
    loop {
        let n = match from.try_read(buf, short) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let mut bytes = &buf[..n];
        while !bytes.is_empty() {
            match to.try_write(bytes) {
                Ok(written) => bytes = &bytes[written..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => writable(to).await,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if short && n < buf.len() {
            return Ok(true);
        }
    }
}
