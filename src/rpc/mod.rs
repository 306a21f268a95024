//! kiln's devices over TVM's RPC protocol: a server that TVM's tracker and clients drive
//! unchanged, and a client that drives any server of the protocol.
//!
//! # Design
//!
//! TVM's RPC moves work to a device on another machine: a client uploads a library, loads it
//! there, copies tensors, calls and times functions. Every server in TVM's tree runs its C++
//! endpoint; this one is written on kiln's runtime, so it serves every kiln device (CPU, OpenCL,
//! CUDA, plugins) and loads libraries kiln or TVM exported. The protocol is TVM 0.21+'s
//! (tvm-ffi type indices, protocol string `"0.8.0"`), matched byte for byte:
//!
//! | file | part |
//! |---|---|
//! | [`wire`] | packets, codes, the packed argument sequence (pure; fuzzed) |
//! | [`session`] | one client's session: the packet loop, handles, syscalls, the server's global functions |
//! | `memory` | the session's allocations, against which every tensor a client sends is checked |
//! | [`link`] | `.o` and `.tar` uploads linked into a `.so` with the system's C compiler (a tar reader that unpacks plain files only) |
//! | [`server`] | listening, the handshake, session threads, tracker registration |
//! | [`tracker`] | the tracker's JSON protocol (server and client sides) |
//! | [`client`] | [`RemoteSession`]: kiln as a client |
//!
//! Where kiln's server differs from TVM's, it is stricter: a tensor's data handle must lie in
//! memory the session allocated (TVM writes wherever a client points); paths stay inside the
//! session's directory; a malformed packet is answered with an exception that says what was
//! wrong and where, instead of ending the process; a session's memory and files are released
//! when it ends however it ends.
//!
//! # What it exposes
//! A client that can connect can run any code on the server: uploading and loading a library
//! is what the protocol is for. The server therefore listens on loopback (`127.0.0.1`) unless
//! told otherwise; put it on a network only behind a trusted boundary, as with TVM's.

pub mod client;
pub mod link;
mod memory;
pub mod server;
pub mod session;
pub mod tracker;
pub mod wire;

pub use client::RemoteSession;
pub use server::{Server, ServerConfig, StopHandle};
pub use session::{Session, SessionEnd, SessionLimits};

/// Errors of the RPC layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// A socket operation failed.
    #[error("{addr}: {source}")]
    Io {
        /// The peer.
        addr: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The peer broke the protocol.
    #[error("RPC protocol error: {0}")]
    Protocol(String),
    /// The remote side raised an error.
    #[error("remote error: {0}")]
    Remote(String),
    /// A configuration that cannot work.
    #[error("{0}")]
    Config(String),
}

impl RpcError {
    pub(crate) fn io(addr: &str, source: std::io::Error) -> Self {
        RpcError::Io {
            addr: addr.to_owned(),
            source,
        }
    }
}
