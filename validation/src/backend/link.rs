//! Real bytes over loopback TCP: the backend's data plane.
//!
//! Every worker's NIC is one TCP connection to a sink on 127.0.0.1; a transfer writes an
//! 8-byte length and the payload, and completes when the sink has read every byte and
//! answered with one byte. So a transfer's measured time is what the kernel's loopback
//! TCP path takes for those bytes (copies, segmentation, scheduling), the same link kind
//! (`tcp`) the simulator prices with a fitted profile. The payload is a fixed pattern:
//! the decision plane (what is stored, what hits) runs through the engine's `Store`; this
//! moves the bytes that take time.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest write per syscall.
const CHUNK: usize = 1 << 20;

/// Why a transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// A socket operation failed.
    #[error("loopback link: {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The Transfer Engine path failed (setup or a transfer).
    #[error(transparent)]
    TransferEngine(#[from] crate::te::TeError),
    /// Bytes that landed at the receiver differ from what was sent.
    #[error("KV handoff {from}->{to}, transfer {seq}: {bytes} bytes landed but byte {at} differs from what was sent")]
    Corrupt {
        /// Sender.
        from: u32,
        /// Receiver.
        to: u32,
        /// The sender's transfer number.
        seq: u64,
        /// Bytes of the chunk.
        bytes: usize,
        /// First differing byte.
        at: usize,
    },
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> LinkError {
    move |source| LinkError::Io { what, source }
}

/// The sink every NIC connects to: reads whole transfers and acknowledges each.
pub struct Sink {
    addr: std::net::SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl Sink {
    /// Listen on an ephemeral loopback port; serve `connections` connections, each on its
    /// own thread, until they close.
    pub fn start(connections: usize) -> Result<Self, LinkError> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(io("bind 127.0.0.1:0"))?;
        let addr = listener.local_addr().map_err(io("local_addr"))?;
        let accept = std::thread::Builder::new()
            .name("sink-accept".into())
            .spawn(move || {
                for _ in 0..connections {
                    let Ok((stream, _)) = listener.accept() else {
                        return;
                    };
                    let _ = std::thread::Builder::new()
                        .name("sink".into())
                        .spawn(move || serve(stream));
                }
            })
            .map_err(io("spawn sink"))?;
        Ok(Self {
            addr,
            accept: Some(accept),
        })
    }

    /// A NIC: one connection to this sink.
    pub fn connect(&self) -> Result<Nic, LinkError> {
        let stream = TcpStream::connect(self.addr).map_err(io("connect to sink"))?;
        stream.set_nodelay(true).map_err(io("set_nodelay"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(io("set_read_timeout"))?;
        Ok(Nic {
            stream,
            pattern: vec![0xA5; CHUNK],
        })
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some(h) = self.accept.take() {
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

fn serve(mut s: TcpStream) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let mut len = [0u8; 8];
        if s.read_exact(&mut len).is_err() {
            return;
        }
        let mut left = u64::from_le_bytes(len);
        while left > 0 {
            let want = left.min(CHUNK as u64) as usize;
            match s.read(&mut buf[..want]) {
                Ok(0) | Err(_) => return,
                Ok(n) => left -= n as u64,
            }
        }
        if s.write_all(&[1]).is_err() {
            return;
        }
    }
}

/// One worker's network interface: transfers on it run one after another (FIFO).
pub struct Nic {
    stream: TcpStream,
    pattern: Vec<u8>,
}

impl Nic {
    /// Move `bytes` of the fixed pattern to the sink and wait for its acknowledgement.
    pub fn send(&mut self, bytes: u64) -> Result<(), LinkError> {
        self.send_from(bytes, None)
    }

    /// Move `payload` itself (a KV handoff's real bytes) to the sink and wait for its
    /// acknowledgement.
    pub fn send_payload(&mut self, payload: &[u8]) -> Result<(), LinkError> {
        self.send_from(payload.len() as u64, Some(payload))
    }

    fn send_from(&mut self, bytes: u64, payload: Option<&[u8]>) -> Result<(), LinkError> {
        let Nic { stream, pattern } = self;
        stream
            .write_all(&bytes.to_le_bytes())
            .map_err(io("write length"))?;
        let mut off = 0usize;
        while (off as u64) < bytes {
            let n = (bytes - off as u64).min(CHUNK as u64) as usize;
            let chunk = match payload {
                Some(p) => &p[off..off + n],
                None => &pattern[..n],
            };
            stream.write_all(chunk).map_err(io("write payload"))?;
            off += n;
        }
        let mut ack = [0u8; 1];
        stream.read_exact(&mut ack).map_err(io("read ack"))?;
        Ok(())
    }
}

impl Drop for Nic {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_of_every_size_complete_in_order() {
        let sink = Sink::start(2).unwrap();
        let mut a = sink.connect().unwrap();
        let mut b = sink.connect().unwrap();
        for bytes in [
            0,
            1,
            7,
            CHUNK as u64 - 1,
            CHUNK as u64,
            3 * CHUNK as u64 + 5,
        ] {
            a.send(bytes).unwrap();
            b.send(bytes).unwrap();
        }
    }
}
