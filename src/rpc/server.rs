//! The server: a listening socket, TVM's handshake, one session at a time, and (with a tracker)
//! the registration that hands the server to the tracker's clients.
//!
//! # Life of a connection
//! 1. The client sends the magic `0xff271`, a key length and `client:<matchkey>[ -timeout=S]`.
//!    A wrong magic is dropped; a key the server does not serve gets `0xff273` (mismatch).
//! 2. The server answers the magic and `server:<key>`, and a [`Session`] serves packets in a
//!    thread of its own, in a fresh directory, until the client shuts it down, disconnects or
//!    its `-timeout` passes (then its socket is closed). A session that panics is logged and
//!    the server goes on.
//! 3. The next connection waits in the listen queue meanwhile, as with TVM's server.
//!
//! # With a tracker
//! A thread keeps a connection to the tracker: `UPDATE_INFO` with the server's key and address,
//! then `PUT` with a fresh match key whenever the server is free (after every session, and when
//! the tracker no longer lists the key as pending). When the tracker goes away the thread
//! reconnects every second until it is back, and registers again.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::session::{Session, SessionEnd, SessionLimits};
use super::tracker::TrackerConn;
use super::wire::{RPC_CODE_MISMATCH, RPC_MAGIC};
use super::RpcError;

/// A sink for the server's log lines.
pub type LogFn = Arc<dyn Fn(&str) + Send + Sync>;

/// How to run a server.
#[derive(Clone)]
pub struct ServerConfig {
    /// The address to listen on. Default `127.0.0.1`: only this machine can connect.
    pub host: String,
    /// The first port to try. Default 9091; 0 takes any free port.
    pub port: u16,
    /// One past the last port to try (TVM's `port_end`). Default 9199.
    pub port_end: u16,
    /// The key the server registers under with a tracker, and answers with (`server:<key>`).
    pub key: String,
    /// A tracker to register with (`host:port`).
    pub tracker: Option<String>,
    /// The address the tracker hands to clients, when not the one the tracker sees.
    pub custom_addr: Option<String>,
    /// Limits of each session.
    pub limits: SessionLimits,
    /// Where session directories are made (default: the system's temporary directory).
    pub workdir_root: Option<PathBuf>,
    /// Where log lines go (default: nowhere).
    pub log: Option<LogFn>,
    /// How long a session polls for the next request before it blocks (default 200 µs; zero
    /// blocks at once). Polling saves the wake-up of the server's thread on every call of a
    /// client that calls in a loop, for some CPU time after each reply.
    pub spin: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".to_owned(),
            port: 9091,
            port_end: 9199,
            key: String::new(),
            tracker: None,
            custom_addr: None,
            limits: SessionLimits::default(),
            workdir_root: None,
            log: None,
            spin: Duration::from_micros(200),
        }
    }
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("key", &self.key)
            .field("tracker", &self.tracker)
            .finish_non_exhaustive()
    }
}

/// State shared by the accepting loop and the tracker thread.
struct Shared {
    stop: AtomicBool,
    busy: AtomicBool,
    /// The accepting loop asks the tracker thread for a fresh `PUT`.
    need_put: AtomicBool,
    /// The match key clients must present (with a tracker).
    matchkey: Mutex<Option<String>>,
    sessions: AtomicU64,
}

/// A bound server.
pub struct Server {
    listener: TcpListener,
    port: u16,
    cfg: ServerConfig,
    shared: Arc<Shared>,
}

/// Stops a running server from another thread.
#[derive(Clone)]
pub struct StopHandle {
    shared: Arc<Shared>,
    addr: String,
}

impl StopHandle {
    /// Asks the server to stop after the current session; returns at once.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accepting loop.
        let _ = TcpStream::connect(&self.addr);
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("port", &self.port)
            .field("cfg", &self.cfg)
            .finish()
    }
}

fn random_key(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let x = blake3::hash(format!("{t}:{n}:{}", std::process::id()).as_bytes());
    format!("{prefix}:0.{}", &x.to_hex()[..16])
}

impl Server {
    /// Binds the first free port of `cfg.port..cfg.port_end` (any port for 0).
    ///
    /// # Errors
    /// [`RpcError::Config`] when no port of the range is free.
    pub fn bind(cfg: ServerConfig) -> Result<Self, RpcError> {
        let ports: Vec<u16> = if cfg.port == 0 {
            vec![0]
        } else {
            (cfg.port..cfg.port_end.max(cfg.port + 1)).collect()
        };
        let mut last = None;
        for p in ports {
            match TcpListener::bind((cfg.host.as_str(), p)) {
                Ok(l) => {
                    let port = l
                        .local_addr()
                        .map_err(|e| RpcError::io(&cfg.host, e))?
                        .port();
                    return Ok(Self {
                        listener: l,
                        port,
                        cfg,
                        shared: Arc::new(Shared {
                            stop: AtomicBool::new(false),
                            busy: AtomicBool::new(false),
                            need_put: AtomicBool::new(true),
                            matchkey: Mutex::new(None),
                            sessions: AtomicU64::new(0),
                        }),
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(RpcError::Config(format!(
            "cannot listen on {} at any port in [{}, {}): {}",
            cfg.host,
            cfg.port,
            cfg.port_end,
            last.map(|e| e.to_string()).unwrap_or_default()
        )))
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A handle that stops the server.
    pub fn stop_handle(&self) -> StopHandle {
        let host = if self.cfg.host == "0.0.0.0" || self.cfg.host == "::" {
            "127.0.0.1"
        } else {
            &self.cfg.host
        };
        StopHandle {
            shared: self.shared.clone(),
            addr: format!("{host}:{}", self.port),
        }
    }

    /// The number of sessions served so far.
    pub fn sessions(&self) -> u64 {
        self.shared.sessions.load(Ordering::SeqCst)
    }

    fn log(&self, msg: &str) {
        if let Some(l) = &self.cfg.log {
            l(msg);
        }
    }

    /// Serves until stopped.
    ///
    /// # Errors
    /// Only for a listening socket that fails; a bad client is logged and dropped.
    pub fn serve(self) -> Result<(), RpcError> {
        self.log(&format!(
            "kiln rpc server listening on {}:{} (key `{}`)",
            self.cfg.host, self.port, self.cfg.key
        ));
        let tracker_thread = self.cfg.tracker.clone().map(|addr| {
            let shared = self.shared.clone();
            let cfg = self.cfg.clone();
            let port = self.port;
            std::thread::Builder::new()
                .name("kiln-rpc-tracker".into())
                .spawn(move || tracker_loop(&addr, &cfg, port, &shared))
        });
        for conn in self.listener.incoming() {
            if self.shared.stop.load(Ordering::SeqCst) {
                break;
            }
            let sock = match conn {
                Ok(s) => s,
                Err(e) => {
                    self.log(&format!("accept failed: {e}"));
                    continue;
                }
            };
            let peer = sock
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into());
            match self.handshake(&sock) {
                Ok(timeout) => {
                    self.shared.busy.store(true, Ordering::SeqCst);
                    self.run_session(sock, &peer, timeout);
                    self.shared.sessions.fetch_add(1, Ordering::SeqCst);
                    self.shared.busy.store(false, Ordering::SeqCst);
                    self.shared.need_put.store(true, Ordering::SeqCst);
                }
                Err(e) => self.log(&format!("refused {peer}: {e}")),
            }
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(Ok(t)) = tracker_thread {
            let _ = t.join();
        }
        Ok(())
    }

    /// Reads the client's greeting; answers it. `Ok(timeout)` starts a session.
    fn handshake(&self, sock: &TcpStream) -> Result<Option<Duration>, String> {
        let mut s = sock;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let mut b = [0u8; 4];
        s.read_exact(&mut b)
            .map_err(|e| format!("reading the magic: {e}"))?;
        let magic = i32::from_le_bytes(b);
        if magic != RPC_MAGIC {
            return Err(format!(
                "wrong magic {magic:#x} (a TVM RPC client sends {RPC_MAGIC:#x})"
            ));
        }
        s.read_exact(&mut b)
            .map_err(|e| format!("reading the key length: {e}"))?;
        let n = i32::from_le_bytes(b);
        if !(0..=4096).contains(&n) {
            return Err(format!("a key of {n} bytes (expected 0..=4096)"));
        }
        let mut key = vec![0u8; n as usize];
        s.read_exact(&mut key)
            .map_err(|e| format!("reading the key: {e}"))?;
        let key = String::from_utf8_lossy(&key).into_owned();
        let mut parts = key.split_whitespace();
        let head = parts.next().unwrap_or("");
        let mut timeout = None;
        for opt in parts {
            if let Some(v) = opt.strip_prefix("-timeout=") {
                timeout = v
                    .parse::<f64>()
                    .ok()
                    .filter(|t| *t > 0.0 && t.is_finite())
                    .map(Duration::from_secs_f64);
            }
        }
        let expected = match &self.cfg.tracker {
            Some(_) => self
                .shared
                .matchkey
                .lock()
                .map(|m| m.clone())
                .unwrap_or(None)
                .unwrap_or_else(|| self.cfg.key.clone()),
            None => self.cfg.key.clone(),
        };
        if head != format!("client:{expected}") {
            let _ = s.write_all(&RPC_CODE_MISMATCH.to_le_bytes());
            return Err(format!("key mismatch: got `{head}`"));
        }
        let server_key = format!("server:{}", self.cfg.key);
        let mut out = RPC_MAGIC.to_le_bytes().to_vec();
        out.extend_from_slice(&(server_key.len() as i32).to_le_bytes());
        out.extend_from_slice(server_key.as_bytes());
        s.write_all(&out).map_err(|e| e.to_string())?;
        s.set_read_timeout(None).map_err(|e| e.to_string())?;
        let _ = sock.set_nodelay(true);
        Ok(timeout)
    }

    fn run_session(&self, sock: TcpStream, peer: &str, timeout: Option<Duration>) {
        let root = self
            .cfg
            .workdir_root
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        let dir = match tempfile::Builder::new()
            .prefix("kiln-rpc-")
            .tempdir_in(&root)
        {
            Ok(d) => d,
            Err(e) => {
                self.log(&format!(
                    "refused {peer}: cannot make a session directory in {}: {e}",
                    root.display()
                ));
                return;
            }
        };
        let (r, w) = match (sock.try_clone(), sock.try_clone()) {
            (Ok(r), Ok(w)) => (r, w),
            _ => return,
        };
        let limits = self.cfg.limits.clone();
        let spin = self.cfg.spin;
        let start = Instant::now();
        self.log(&format!(
            "session from {peer} in {}{}",
            dir.path().display(),
            timeout.map_or(String::new(), |t| format!(" (timeout {t:?})"))
        ));
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("kiln-rpc-session".into())
            .spawn(move || {
                let end = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut s = Session::new(
                        std::io::BufReader::with_capacity(1 << 16, SpinRead { s: r, spin }),
                        w,
                        dir.path().to_path_buf(),
                        limits,
                    );
                    s.run()
                }))
                .unwrap_or_else(|p| {
                    SessionEnd::Error(format!(
                        "the session panicked: {}",
                        crate::util::panic_message(&*p)
                    ))
                });
                drop(dir);
                let _ = tx.send(end);
            });
        if let Err(e) = spawned {
            self.log(&format!(
                "refused {peer}: cannot start a session thread: {e}"
            ));
            return;
        }
        let end = match timeout {
            Some(t) => match rx.recv_timeout(t) {
                Ok(end) => end,
                Err(_) => {
                    // The session's thread ends at its next read or write; its memory and
                    // directory go with it.
                    let _ = sock.shutdown(Shutdown::Both);
                    SessionEnd::Error(format!("the session's {t:?} timeout expired"))
                }
            },
            None => rx
                .recv()
                .unwrap_or_else(|_| SessionEnd::Error("the session thread vanished".into())),
        };
        let _ = sock.shutdown(Shutdown::Both);
        self.log(&format!(
            "session from {peer} ended after {:.2} s: {}",
            start.elapsed().as_secs_f64(),
            match end {
                SessionEnd::Shutdown => "shutdown".to_owned(),
                SessionEnd::Closed => "the client disconnected".to_owned(),
                SessionEnd::Error(e) => format!("error: {e}"),
            }
        ));
    }
}

/// The session's reading end: after each reply it polls the socket for the next request for a
/// while (`spin`) before blocking in the kernel, so that a client calling in a loop does not
/// pay for the server thread's wake-up on every call. The socket is non-blocking only while it
/// polls: the reply is always written to a blocking socket.
struct SpinRead {
    s: TcpStream,
    spin: Duration,
}

impl Read for SpinRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.spin.is_zero() {
            return self.s.read(buf);
        }
        self.s.set_nonblocking(true)?;
        let start = Instant::now();
        let r = loop {
            match self.s.read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if start.elapsed() < self.spin {
                        std::hint::spin_loop();
                        continue;
                    }
                    self.s.set_nonblocking(false)?;
                    break self.s.read(buf);
                }
                r => break r,
            }
        };
        self.s.set_nonblocking(false)?;
        r
    }
}

fn tracker_loop(addr: &str, cfg: &ServerConfig, port: u16, shared: &Shared) {
    let log = |m: &str| {
        if let Some(l) = &cfg.log {
            l(m);
        }
    };
    let host = cfg.custom_addr.clone().unwrap_or_else(|| cfg.host.clone());
    let mut reported_down = false;
    while !shared.stop.load(Ordering::SeqCst) {
        let conn = TrackerConn::connect(addr, Duration::from_secs(5)).and_then(|mut c| {
            c.update_info(&cfg.key, &host, port)?;
            Ok(c)
        });
        let mut conn = match conn {
            Ok(c) => {
                log(&format!(
                    "registered with the tracker at {addr} as `{}`",
                    cfg.key
                ));
                reported_down = false;
                c
            }
            Err(e) => {
                if !reported_down {
                    log(&format!("tracker {addr}: {e}; retrying every second"));
                    reported_down = true;
                }
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        shared.need_put.store(true, Ordering::SeqCst);
        let mut unmatched = 0u32;
        let mut last_ping = Instant::now();
        let result: Result<(), RpcError> = (|| loop {
            if shared.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let busy = shared.busy.load(Ordering::SeqCst);
            if !busy && shared.need_put.swap(false, Ordering::SeqCst) {
                let mk = random_key(&cfg.key);
                if let Ok(mut m) = shared.matchkey.lock() {
                    *m = Some(mk.clone());
                }
                conn.put(&cfg.key, port, &mk, cfg.custom_addr.as_deref())?;
                unmatched = 0;
            }
            if last_ping.elapsed() >= Duration::from_secs(2) {
                last_ping = Instant::now();
                let pending = conn.pending_matchkeys()?;
                let mine = shared.matchkey.lock().ok().and_then(|m| m.clone());
                if !busy {
                    if mine.is_some_and(|k| pending.contains(&k)) {
                        unmatched = 0;
                    } else {
                        unmatched += 1;
                        // As TVM's server: a key no client has used for a few seconds is
                        // replaced (the tracker may have handed it to a client that vanished).
                        if unmatched >= 3 {
                            shared.need_put.store(true, Ordering::SeqCst);
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        })();
        if let Err(e) = result {
            log(&format!("lost the tracker at {addr}: {e}; reconnecting"));
            reported_down = true;
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}
