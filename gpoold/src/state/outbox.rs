//! What gpoold sends each agent: a bounded queue, so an agent that reads
//! slower than gpoold writes has its link cut rather than growing gpoold's
//! memory without end; and a small lane of its own for users' terminal
//! input, which waits behind every control message and pushes back on the
//! typist when full instead of cutting the node's link.

use gpool_proto::pb;
use tokio::sync::mpsc;

/// Messages waiting for one agent, at most `OUTBOX_CAPACITY`: an agent
/// that reads slower than gpoold writes has its link cut (its link's
/// stream ends with the reason) and registers anew, rather than growing
/// gpoold's memory without end.
#[derive(Debug, Clone)]
pub struct Outbox {
    sender: mpsc::Sender<pb::ControllerMessage>,
    input: mpsc::Sender<pb::ControllerMessage>,
    overflow: std::sync::Arc<tokio::sync::Notify>,
}

/// Most messages waiting for one agent. A node gets a few a second
/// (leases, launches and kills of its few GPUs' jobs, log reads).
pub const OUTBOX_CAPACITY: usize = 16_384;

/// Most terminal input messages waiting for one agent, of at most
/// `MAX_INPUT_BYTES` each: what users type into a node's jobs holds at
/// most 4 MiB of gpoold's memory.
pub const INPUT_CAPACITY: usize = 64;
pub const MAX_INPUT_BYTES: usize = 64 << 10;

/// Why a message was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotSent {
    /// The link is gone, or its outbox overflowed (which cuts it).
    Gone,
    /// The input lane is full: the typist tries again later.
    InputFull,
}

impl Outbox {
    /// The outbox and its link's side: the messages, then an error once
    /// the outbox overflowed.
    pub fn new() -> (
        Outbox,
        impl tokio_stream::Stream<Item = Result<pb::ControllerMessage, tonic::Status>>,
    ) {
        let (sender, receiver) = mpsc::channel(OUTBOX_CAPACITY);
        let (input, input_receiver) = mpsc::channel(INPUT_CAPACITY);
        let overflow = std::sync::Arc::new(tokio::sync::Notify::new());
        let outbox = Outbox {
            sender,
            input,
            overflow: overflow.clone(),
        };
        let lanes = Some((receiver, input_receiver, overflow));
        let stream = futures_util::stream::unfold(lanes, |state| async move {
            let (mut receiver, mut input, overflow) = state?;
            // Control first: leases, kills and launches never wait behind
            // what users type.
            let message = tokio::select! {
                biased;
                () = overflow.notified() => {
                    return Some((
                        Err(tonic::Status::resource_exhausted(format!(
                            "this agent read too slowly: {OUTBOX_CAPACITY} messages waited for it; register again"
                        ))),
                        None,
                    ))
                }
                message = receiver.recv() => message?,
                Some(message) = input.recv() => message,
            };
            let mut message = message;
            // Every message carries the leader's term (fencing).
            message.term = crate::ha::term();
            Some((Ok(message), Some((receiver, input, overflow))))
        });
        (outbox, stream)
    }

    /// Queues `message`; false when the link is gone, or the outbox is
    /// full (which cuts the link), or it is terminal input and the input
    /// lane is full.
    pub fn send(&self, message: pb::ControllerMessage) -> bool {
        self.try_send(message).is_ok()
    }

    /// Queues `message`, or says why not.
    pub fn try_send(&self, message: pb::ControllerMessage) -> Result<(), NotSent> {
        if matches!(message.msg, Some(pb::controller_message::Msg::Input(_))) {
            return match self.input.try_send(message) {
                Ok(()) => Ok(()),
                Err(mpsc::error::TrySendError::Full(_)) => Err(NotSent::InputFull),
                Err(mpsc::error::TrySendError::Closed(_)) => Err(NotSent::Gone),
            };
        }
        match self.sender.try_send(message) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.overflow.notify_one();
                Err(NotSent::Gone)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(NotSent::Gone),
        }
    }

    /// A handle that does not keep the link open.
    pub fn downgrade(&self) -> WeakOutbox {
        WeakOutbox {
            sender: self.sender.downgrade(),
            input: self.input.downgrade(),
            overflow: self.overflow.clone(),
        }
    }
}

/// An `Outbox` that lets the link end when the state drops it.
#[derive(Debug, Clone)]
pub struct WeakOutbox {
    sender: mpsc::WeakSender<pb::ControllerMessage>,
    input: mpsc::WeakSender<pb::ControllerMessage>,
    overflow: std::sync::Arc<tokio::sync::Notify>,
}

impl WeakOutbox {
    pub fn upgrade(&self) -> Option<Outbox> {
        Some(Outbox {
            sender: self.sender.upgrade()?,
            input: self.input.upgrade()?,
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

    fn input(byte: u8) -> pb::ControllerMessage {
        pb::ControllerMessage {
            term: 0,
            msg: Some(pb::controller_message::Msg::Input(pb::TerminalInput {
                job_id: 1,
                epoch: 1,
                data: vec![byte; MAX_INPUT_BYTES],
                resize: None,
            })),
        }
    }

    /// Terminal input fills a lane of its own: once full, more is refused
    /// (the typist waits) and the link stays; leases queued after the
    /// input go out before it.
    #[tokio::test]
    async fn input_waits_behind_control_and_a_full_input_lane_keeps_the_link() {
        let (outbox, stream) = Outbox::new();
        for _ in 0..INPUT_CAPACITY {
            assert_eq!(outbox.try_send(input(b'x')), Ok(()));
        }
        assert_eq!(outbox.try_send(input(b'y')), Err(NotSent::InputFull));
        assert!(outbox.send(lease(7)), "control still goes");
        let mut stream = Box::pin(stream);
        let first = stream.next().await.expect("an item").expect("no error");
        assert!(
            matches!(first.msg, Some(pb::controller_message::Msg::Lease(ref lease)) if lease.heartbeat_seq == 7),
            "the lease first: {first:?}"
        );
        let next = stream.next().await.expect("an item").expect("no error");
        assert!(matches!(next.msg, Some(pb::controller_message::Msg::Input(_))));
        assert_eq!(outbox.try_send(input(b'z')), Ok(()), "room again");
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
