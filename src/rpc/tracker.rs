//! TVM's tracker protocol, both sides kiln needs: a server registering its devices, and a
//! client asking for one.
//!
//! After both ends exchange the `i32` magic `0x2f271`, every message is an `i32` length and that
//! many bytes of JSON: a request is a list whose first item is a [`code`], and the answer is
//! `0` (success) or a list starting with it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value as Json};

use super::wire::TRACKER_MAGIC;
use super::RpcError;

/// The tracker's message codes (`TrackerCode` in `tvm/rpc/base.py`).
pub mod code {
    /// Success.
    pub const SUCCESS: i64 = 0;
    /// A server offers itself: `[PUT, key, [port, matchkey], custom_addr]`.
    pub const PUT: i64 = 3;
    /// A client asks for a server: `[REQUEST, key, user, priority]`.
    pub const REQUEST: i64 = 4;
    /// A server says who it is: `[UPDATE_INFO, {"key": "server:<key>", "addr": [host, port]}]`.
    pub const UPDATE_INFO: i64 = 5;
    /// The tracker's summary.
    pub const SUMMARY: i64 = 6;
    /// The match keys still waiting for a client.
    pub const GET_PENDING_MATCHKEYS: i64 = 7;
}

/// The largest tracker message read (a summary of a large farm fits easily).
const MAX_MESSAGE: i32 = 16 << 20;

/// A connection to a tracker.
pub struct TrackerConn {
    sock: TcpStream,
    addr: String,
}

impl TrackerConn {
    /// Connects to `addr` (`host:port`) and exchanges the magic.
    ///
    /// # Errors
    /// [`RpcError::Io`] when the tracker cannot be reached; [`RpcError::Protocol`] when the peer
    /// is not a tracker.
    pub fn connect(addr: &str, timeout: Duration) -> Result<Self, RpcError> {
        let sock = super::client::connect_addr(addr, timeout)?;
        sock.set_read_timeout(Some(timeout.max(Duration::from_secs(5))))
            .map_err(|e| RpcError::io(addr, e))?;
        let _ = sock.set_nodelay(true);
        let mut c = Self {
            sock,
            addr: addr.to_owned(),
        };
        c.sock
            .write_all(&TRACKER_MAGIC.to_le_bytes())
            .map_err(|e| RpcError::io(addr, e))?;
        let mut m = [0u8; 4];
        c.sock
            .read_exact(&mut m)
            .map_err(|e| RpcError::io(addr, e))?;
        let magic = i32::from_le_bytes(m);
        if magic != TRACKER_MAGIC {
            return Err(RpcError::Protocol(format!(
                "{addr} is not an RPC tracker: it answered the magic {TRACKER_MAGIC:#x} with \
                 {magic:#x}"
            )));
        }
        Ok(c)
    }

    /// Sends one message and reads the answer.
    ///
    /// # Errors
    /// I/O errors, and an answer that is not JSON.
    pub fn request(&mut self, msg: &Json) -> Result<Json, RpcError> {
        let text = msg.to_string();
        let mut out = (text.len() as i32).to_le_bytes().to_vec();
        out.extend_from_slice(text.as_bytes());
        self.sock
            .write_all(&out)
            .map_err(|e| RpcError::io(&self.addr, e))?;
        let mut len = [0u8; 4];
        self.sock
            .read_exact(&mut len)
            .map_err(|e| RpcError::io(&self.addr, e))?;
        let len = i32::from_le_bytes(len);
        if !(0..=MAX_MESSAGE).contains(&len) {
            return Err(RpcError::Protocol(format!(
                "tracker {}: a message of {len} bytes (expected 0..={MAX_MESSAGE})",
                self.addr
            )));
        }
        let mut buf = vec![0u8; len as usize];
        self.sock
            .read_exact(&mut buf)
            .map_err(|e| RpcError::io(&self.addr, e))?;
        serde_json::from_slice(&buf).map_err(|e| {
            RpcError::Protocol(format!(
                "tracker {}: the answer is not JSON: {e}",
                self.addr
            ))
        })
    }

    fn expect_success(&mut self, msg: &Json) -> Result<(), RpcError> {
        let ans = self.request(msg)?;
        if ans != json!(code::SUCCESS) {
            return Err(RpcError::Protocol(format!(
                "tracker {}: {msg} was answered {ans}, expected 0",
                self.addr
            )));
        }
        Ok(())
    }

    /// A server says who it is.
    pub fn update_info(&mut self, key: &str, host: &str, port: u16) -> Result<(), RpcError> {
        self.expect_success(&json!([
            code::UPDATE_INFO,
            {"key": format!("server:{key}"), "addr": [host, port]}
        ]))
    }

    /// A server offers itself under `key` with a fresh `matchkey`.
    pub fn put(
        &mut self,
        key: &str,
        port: u16,
        matchkey: &str,
        custom_addr: Option<&str>,
    ) -> Result<(), RpcError> {
        self.expect_success(&json!([code::PUT, key, [port, matchkey], custom_addr]))
    }

    /// The match keys the tracker still holds for servers.
    pub fn pending_matchkeys(&mut self) -> Result<Vec<String>, RpcError> {
        let ans = self.request(&json!([code::GET_PENDING_MATCHKEYS]))?;
        Ok(ans
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// A client asks for a server of `key`: the answer is its host, port and match key.
    pub fn request_server(
        &mut self,
        key: &str,
        priority: i64,
    ) -> Result<(String, u16, String), RpcError> {
        // The tracker answers when a server is free, which may take a while.
        self.sock
            .set_read_timeout(None)
            .map_err(|e| RpcError::io(&self.addr, e))?;
        let ans = self.request(&json!([code::REQUEST, key, "", priority]))?;
        let bad = || {
            RpcError::Protocol(format!(
                "tracker {}: REQUEST for `{key}` was answered {ans}, expected [0, [host, port, \
                 matchkey]]",
                self.addr
            ))
        };
        let a = ans.as_array().ok_or_else(bad)?;
        if a.first() != Some(&json!(code::SUCCESS)) {
            return Err(bad());
        }
        let v = a.get(1).and_then(Json::as_array).ok_or_else(bad)?;
        let host = v.first().and_then(Json::as_str).ok_or_else(bad)?;
        let port = v
            .get(1)
            .and_then(Json::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(bad)?;
        let mk = v.get(2).and_then(Json::as_str).ok_or_else(bad)?;
        Ok((host.to_owned(), port, mk.to_owned()))
    }

    /// The tracker's summary (`[SUMMARY]`).
    pub fn summary(&mut self) -> Result<Json, RpcError> {
        let ans = self.request(&json!([code::SUMMARY]))?;
        match ans.as_array() {
            Some(a) if a.first() == Some(&json!(code::SUCCESS)) => {
                Ok(a.get(1).cloned().unwrap_or(Json::Null))
            }
            _ => Err(RpcError::Protocol(format!(
                "tracker {}: SUMMARY was answered {ans}",
                self.addr
            ))),
        }
    }
}
