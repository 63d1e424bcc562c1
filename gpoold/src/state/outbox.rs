//! What gpoold sends each agent: a bounded queue, so an agent that reads
//! slower than gpoold writes has its link cut rather than growing gpoold's
//! memory without end.

use gpool_proto::pb;
use tokio::sync::mpsc;

/// Messages waiting for one agent, at most `OUTBOX_CAPACITY`: an agent
/// that reads slower than gpoold writes has its link cut (its link's
/// stream ends with the reason) and registers anew, rather than growing
/// gpoold's memory without end.
#[derive(Debug, Clone)]
pub struct Outbox {
    sender: mpsc::Sender<pb::ControllerMessage>,
    overflow: std::sync::Arc<tokio::sync::Notify>,
}

/// Most messages waiting for one agent. A node gets a few a second
/// (leases, launches and kills of its few GPUs' jobs, log reads).
pub const OUTBOX_CAPACITY: usize = 16_384;

impl Outbox {
    /// The outbox and its link's side: the messages, then an error once
    /// the outbox overflowed.
    pub fn new() -> (
        Outbox,
        impl tokio_stream::Stream<Item = Result<pb::ControllerMessage, tonic::Status>>,
    ) {
        let (sender, receiver) = mpsc::channel(OUTBOX_CAPACITY);
        let overflow = std::sync::Arc::new(tokio::sync::Notify::new());
        let outbox = Outbox {
            sender,
            overflow: overflow.clone(),
        };
        let stream = futures_util::stream::unfold(Some((receiver, overflow)), |state| async move {
            let (mut receiver, overflow) = state?;
            tokio::select! {
                biased;
                () = overflow.notified() => Some((
                    Err(tonic::Status::resource_exhausted(format!(
                        "this agent read too slowly: {OUTBOX_CAPACITY} messages waited for it; register again"
                    ))),
                    None,
                )),
                message = receiver.recv() => message.map(|mut message| {
                    // Every message carries the leader's term (fencing).
                    message.term = crate::ha::term();
                    (Ok(message), Some((receiver, overflow)))
                }),
            }
        });
        (outbox, stream)
    }

    /// Queues `message`; false when the link is gone, or the outbox is
    /// full (which cuts the link).
    pub fn send(&self, message: pb::ControllerMessage) -> bool {
        match self.sender.try_send(message) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.overflow.notify_one();
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// A handle that does not keep the link open.
    pub fn downgrade(&self) -> WeakOutbox {
        WeakOutbox {
            sender: self.sender.downgrade(),
            overflow: self.overflow.clone(),
        }
    }
}

/// An `Outbox` that lets the link end when the state drops it.
#[derive(Debug, Clone)]
pub struct WeakOutbox {
    sender: mpsc::WeakSender<pb::ControllerMessage>,
    overflow: std::sync::Arc<tokio::sync::Notify>,
}

impl WeakOutbox {
    pub fn upgrade(&self) -> Option<Outbox> {
        Some(Outbox {
            sender: self.sender.upgrade()?,
            overflow: self.overflow.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn lease(seq: u64) -> pb::ControllerMessage {
        pb::ControllerMessage {
            term: 0,
            msg: Some(pb::controller_message::Msg::Lease(pb::Lease {
                heartbeat_seq: seq,
                fence_after_ms: 1,
                fence_grace_ms: 1,
            })),
        }
    }

    /// An agent that reads nothing gets its outbox's worth, then the link
    /// ends with the reason; gpoold's memory for it stays bounded.
    #[tokio::test]
    async fn an_agent_that_does_not_read_has_its_link_cut_with_the_reason() {
        let (outbox, stream) = Outbox::new();
        for seq in 0..OUTBOX_CAPACITY as u64 {
            assert!(outbox.send(lease(seq)));
        }
        assert!(!outbox.send(lease(u64::MAX)), "a full outbox takes no more");
        let mut stream = Box::pin(stream);
        let first = stream.next().await.expect("an item");
        let status = first.expect_err("the overflow comes first");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("read too slowly"), "{}", status.message());
        assert!(stream.next().await.is_none(), "and the link ends");
    }

    /// A link whose state dropped its outbox ends; a weak handle does not
    /// keep it open.
    #[tokio::test]
    async fn a_dropped_outbox_ends_its_link() {
        let (outbox, stream) = Outbox::new();
        let weak = outbox.downgrade();
        assert!(outbox.send(lease(1)));
        drop(outbox);
        let items: Vec<_> = stream.collect().await;
        assert_eq!(items.len(), 1);
        assert!(weak.upgrade().is_none());
    }
}
