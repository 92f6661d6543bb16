//! How nodes talk: RPC messages, the [`Transport`] seam, and its TCP implementation.
//!
//! A request is one frame, answered by one frame: `len: u32 LE | JSON`. The sending side only
//! needs "send these bytes to that address, give me the reply's bytes within this time" (the
//! [`Transport`] trait), and the receiving side is [`MetaNode::handle_rpc`](crate::MetaNode::handle_rpc)
//! (bytes in, bytes out), so the server can later carry both on its own port and connections.
//! [`TcpTransport`] and [`serve_tcp`] are the stand-alone implementation: one connection per
//! call, which costs a loopback connect per heartbeat and keeps no state that could go stale.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::error::MetaError;
use crate::state::{MetaCommand, MetaReply, NodeId};
use crate::TypeConfig;

/// The largest frame accepted (a snapshot chunk, a batch of entries): a peer announcing more is
/// broken or hostile, and is cut off rather than trusted with an allocation.
pub const MAX_FRAME: usize = 64 << 20;

/// Why a call over a [`Transport`] failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// The peer could not be reached: the request was certainly not delivered.
    #[error("{addr} unreachable: {reason}")]
    Unreachable {
        /// The peer.
        addr: String,
        /// Why.
        reason: String,
    },
    /// No whole reply within the timeout: the request may have been delivered.
    #[error("{addr}: no reply within {timeout:?}")]
    Timeout {
        /// The peer.
        addr: String,
        /// The limit.
        timeout: Duration,
    },
    /// The connection failed after the request may have been delivered.
    #[error("{addr}: {reason}")]
    Io {
        /// The peer.
        addr: String,
        /// Why.
        reason: String,
    },
}

/// A boxed future, so that [`Transport`] can be a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Sends one request to a peer and returns its reply, within `timeout`. The server implements
/// it over its own connections; [`TcpTransport`] is the stand-alone one.
pub trait Transport: Send + Sync + 'static {
    /// Send `request` to `addr`; the whole call (connect included) ends within `timeout`.
    fn call<'a>(
        &'a self,
        addr: &'a str,
        request: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, TransportError>>;
}

/// A fresh TCP connection per call, framed as the module doc says.
#[derive(Debug, Clone, Default)]
pub struct TcpTransport;

impl Transport for TcpTransport {
    fn call<'a>(
        &'a self,
        addr: &'a str,
        request: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, TransportError>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let unreachable = |reason: String| TransportError::Unreachable {
                addr: addr.to_owned(),
                reason,
            };
            let timed_out = || TransportError::Timeout {
                addr: addr.to_owned(),
                timeout,
            };
            let mut stream = match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await
            {
                Err(_) => return Err(unreachable(format!("connect timed out after {timeout:?}"))),
                Ok(Err(e)) => return Err(unreachable(e.to_string())),
                Ok(Ok(s)) => s,
            };
            let _ = stream.set_nodelay(true);
            let exchange = async {
                write_frame(&mut stream, &request).await?;
                read_frame(&mut stream).await
            };
            match tokio::time::timeout_at(deadline, exchange).await {
                Err(_) => Err(timed_out()),
                Ok(Err(e)) => Err(TransportError::Io {
                    addr: addr.to_owned(),
                    reason: e.to_string(),
                }),
                Ok(Ok(reply)) => Ok(reply),
            }
        })
    }
}

/// Write one frame.
pub async fn write_frame<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    payload: &[u8],
) -> std::io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l as usize <= MAX_FRAME)
        .ok_or_else(|| std::io::Error::other("frame too large"))?;
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf).await?;
    w.flush().await
}

/// Read one frame.
pub async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "frame of {len} bytes is over the limit"
        )));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Serve `handler` (normally [`MetaNode::handle_rpc`](crate::MetaNode::handle_rpc)) on
/// `listener`: one request frame, one reply frame, any number per connection. Aborting the
/// returned task closes the listener and every connection it accepted.
pub fn serve_tcp<H, F>(listener: TcpListener, handler: H) -> tokio::task::JoinHandle<()>
where
    H: Fn(Vec<u8>) -> F + Send + Sync + Clone + 'static,
    F: Future<Output = Vec<u8>> + Send + 'static,
{
    tokio::spawn(async move {
        // Owned here, so aborting this task aborts the connections too.
        let mut conns = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((mut stream, _)) = accepted else {
                        // Out of descriptors and the like: do not spin.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let handler = handler.clone();
                    conns.spawn(async move {
                        while let Ok(req) = read_frame(&mut stream).await {
                            let reply = handler(req).await;
                            if write_frame(&mut stream, &reply).await.is_err() {
                                break;
                            }
                        }
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    })
}

/// A request as it travels: with the node it is meant for, so that a process answering at an
/// address under another id (a server restarted there without its Raft state, which is a new
/// node) refuses what was meant for the old one instead of acting as it.
#[derive(Serialize)]
pub(crate) struct Envelope<'a> {
    pub(crate) to: Option<NodeId>,
    pub(crate) rpc: &'a Rpc,
}

/// [`Envelope`] as received.
#[derive(Deserialize)]
pub(crate) struct Received {
    pub(crate) to: Option<NodeId>,
    pub(crate) rpc: Rpc,
}

/// A request between nodes.
#[derive(Serialize, Deserialize)]
pub(crate) enum Rpc {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A write forwarded to the leader, to be done within `timeout_ms`.
    Forward {
        write: Write,
        timeout_ms: u64,
    },
    /// A follower's linearizable read: the leader's read index, within `timeout_ms`.
    ReadIndex {
        timeout_ms: u64,
    },
}

/// A write through the leader: a command, or a membership change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Write {
    Command(MetaCommand),
    AddLearner {
        id: NodeId,
        addr: String,
    },
    ChangeMembership {
        voters: std::collections::BTreeSet<NodeId>,
    },
    RemoveLearners {
        ids: std::collections::BTreeSet<NodeId>,
    },
}

/// The reply to an [`Rpc`], variant for variant.
#[derive(Serialize, Deserialize)]
pub(crate) enum RpcReply {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    Forward(Result<MetaReply, MetaError>),
    ReadIndex(Result<u64, MetaError>),
    /// The request could not be decoded.
    Malformed(String),
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("RPC messages encode")
}

/// Makes the per-peer clients openraft asks for.
pub(crate) struct NetworkFactory {
    pub(crate) me: NodeId,
    pub(crate) transport: Arc<dyn Transport>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        PeerClient {
            me: self.me,
            target,
            addr: node.addr.clone(),
            transport: self.transport.clone(),
        }
    }
}

/// openraft's view of one peer.
pub(crate) struct PeerClient {
    me: NodeId,
    target: NodeId,
    addr: String,
    transport: Arc<dyn Transport>,
}

impl PeerClient {
    /// One RPC; every error is mapped to the kind openraft expects so that it backs off from an
    /// unreachable peer and retries the others.
    async fn call<E: std::error::Error>(
        &self,
        rpc: &Rpc,
        action: RPCTypes,
        timeout: Duration,
    ) -> Result<RpcReply, RPCError<NodeId, BasicNode, E>> {
        let reply = self
            .transport
            .call(
                &self.addr,
                encode(&Envelope {
                    to: Some(self.target),
                    rpc,
                }),
                timeout,
            )
            .await
            .map_err(|e| match e {
                TransportError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&e)),
                TransportError::Timeout { .. } => RPCError::Timeout(Timeout {
                    action,
                    id: self.me,
                    target: self.target,
                    timeout,
                }),
                TransportError::Io { .. } => RPCError::Network(NetworkError::new(&e)),
            })?;
        serde_json::from_slice(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }

    fn unexpected<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        let e = std::io::Error::other(format!("unexpected reply from {}", self.addr));
        RPCError::Network(NetworkError::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let rpc = Rpc::AppendEntries(rpc);
        match self
            .call(&rpc, RPCTypes::AppendEntries, option.hard_ttl())
            .await?
        {
            RpcReply::AppendEntries(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(self.unexpected()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let rpc = Rpc::InstallSnapshot(rpc);
        match self
            .call(&rpc, RPCTypes::InstallSnapshot, option.hard_ttl())
            .await?
        {
            RpcReply::InstallSnapshot(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(self.unexpected()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let rpc = Rpc::Vote(rpc);
        match self.call(&rpc, RPCTypes::Vote, option.hard_ttl()).await? {
            RpcReply::Vote(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(self.unexpected()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_gets_its_reply_and_a_silent_or_absent_peer_costs_only_the_timeout() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap().to_string();
        let server = serve_tcp(echo, |req: Vec<u8>| async move {
            req.into_iter().rev().collect()
        });
        let t = TcpTransport;
        let reply = t
            .call(&echo_addr, b"abc".to_vec(), Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(reply, b"cba");

        // A peer that accepts and never answers (hung, stopped).
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_addr = silent.local_addr().unwrap().to_string();
        let start = tokio::time::Instant::now();
        let r = t
            .call(&silent_addr, b"x".to_vec(), Duration::from_millis(300))
            .await;
        assert!(matches!(r, Err(TransportError::Timeout { .. })), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(2));

        // A peer that is gone: nothing listens on the port any more.
        server.abort();
        let _ = server.await;
        let r = t
            .call(&echo_addr, b"x".to_vec(), Duration::from_millis(300))
            .await;
        assert!(
            matches!(r, Err(TransportError::Unreachable { .. })),
            "{r:?}"
        );
        drop(silent);
    }

    #[tokio::test]
    async fn an_oversized_frame_is_refused_before_allocating() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
        assert!(read_frame(&mut b).await.is_err());
    }
}
