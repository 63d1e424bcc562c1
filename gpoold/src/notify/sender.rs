//! Sending notifications on threads of their own: a bounded queue that
//! drops (and counts) what does not fit, a few sender threads, and at most
//! `PER_DESTINATION` posts in flight to one receiver. A receiver that
//! accepts and never answers holds two threads at most; it never takes the
//! blocking threads requests need, nor grows gpoold without end.

use gpool_core::model::Notify;
use gpool_proto::pb;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

/// Events waiting to be sent, at most.
pub const QUEUE_CAPACITY: usize = 1024;
/// Threads that send.
const N_SENDERS: usize = 4;
/// Posts in flight to one receiver (scheme, host and port; all mail is one).
const PER_DESTINATION: usize = 2;

/// One event to send.
pub struct Outgoing {
    pub notify: Notify,
    pub sendmail: Option<String>,
    pub event: &'static str,
    pub job: pb::Job,
}

#[derive(Default)]
struct Inner {
    waiting: VecDeque<Outgoing>,
    in_flight: HashMap<String, usize>,
    closed: bool,
}

#[derive(Default)]
struct Queue {
    inner: Mutex<Inner>,
    changed: Condvar,
}

/// The queue and its sender threads; dropping it lets them end (each
/// after the post it is on, if any).
pub struct Senders {
    queue: Arc<Queue>,
}

impl Senders {
    /// Starts the sender threads; `deliver` sends one event (with its
    /// retries), blocking.
    pub fn start(deliver: fn(Outgoing)) -> Senders {
        let queue = Arc::new(Queue::default());
        for index in 0..N_SENDERS {
            let queue = queue.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("gpoold-notify-{index}"))
                .spawn(move || send_until_closed(&queue, deliver));
            if let Err(err) = spawned {
                tracing::error!("notifications: cannot start a sender thread: {err}");
            }
        }
        Senders { queue }
    }

    /// Queues `outgoing`; false where the queue is full (it is dropped).
    pub fn offer(&self, outgoing: Outgoing) -> bool {
        let mut inner = self.queue.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if inner.waiting.len() >= QUEUE_CAPACITY {
            return false;
        }
        inner.waiting.push_back(outgoing);
        self.queue.changed.notify_one();
        true
    }
}

impl Drop for Senders {
    fn drop(&mut self) {
        let mut inner = self.queue.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        inner.closed = true;
        self.queue.changed.notify_all();
    }
}

/// Where a notification goes, as far as limiting goes: `scheme://host:port`
/// of a webhook, or `mail`.
pub fn destination(to: &str) -> String {
    if to.starts_with("mail:") {
        return "mail".to_string();
    }
    let (scheme, rest) = to.split_once("://").unwrap_or(("", to));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    // Credentials are no part of where it goes.
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    format!("{scheme}://{}", host_port.to_ascii_lowercase())
}

/// Takes the first waiting event whose receiver has room, sends it, and
/// so on until the queue is closed.
fn send_until_closed(queue: &Queue, deliver: fn(Outgoing)) {
    loop {
        let (outgoing, to) = {
            let mut inner = queue.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            loop {
                if inner.closed {
                    return;
                }
                let in_flight = &inner.in_flight;
                let found = inner.waiting.iter().position(|outgoing| {
                    in_flight.get(&destination(&outgoing.notify.to)).copied().unwrap_or(0) < PER_DESTINATION
                });
                if let Some(index) = found {
                    let outgoing = inner.waiting.remove(index).expect("a found index");
                    let to = destination(&outgoing.notify.to);
                    *inner.in_flight.entry(to.clone()).or_default() += 1;
                    break (outgoing, to);
                }
                inner = queue
                    .changed
                    .wait(inner)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        };
        deliver(outgoing);
        let mut inner = queue.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = inner.in_flight.get_mut(&to) {
            *count -= 1;
            if *count == 0 {
                inner.in_flight.remove(&to);
            }
        }
        queue.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_is_scheme_host_and_port() {
        assert_eq!(
            destination("http://Hooks.example:8080/a/b?x=1"),
            "http://hooks.example:8080"
        );
        assert_eq!(destination("https://user:pw@h.example/x"), "https://h.example");
        assert_eq!(destination("mail:alice@example.com"), "mail");
    }

    fn outgoing(to: &str) -> Outgoing {
        Outgoing {
            notify: Notify {
                to: to.to_string(),
                on_start: false,
                on_end: true,
                on_fail: false,
            },
            sendmail: None,
            event: "end",
            job: pb::Job::default(),
        }
    }

    static SENT: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// A receiver that never answers holds `PER_DESTINATION` threads; the
    /// others go on sending elsewhere; the queue is bounded.
    #[test]
    fn a_hanging_receiver_holds_two_senders_and_others_go_on() {
        fn deliver(outgoing: Outgoing) {
            if outgoing.notify.to.contains("hang") {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
            SENT.lock().unwrap().push(outgoing.notify.to);
        }
        let senders = Senders::start(deliver);
        for _ in 0..10 {
            assert!(senders.offer(outgoing("http://hang.example/h")));
        }
        for index in 0..20 {
            assert!(senders.offer(outgoing(&format!("http://ok.example/{index}"))));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while SENT.lock().unwrap().len() < 20 {
            assert!(std::time::Instant::now() < deadline, "{:?}", SENT.lock().unwrap());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let waiting = QUEUE_CAPACITY - 8;
        for _ in 0..waiting {
            assert!(senders.offer(outgoing("http://hang.example/h")));
        }
        assert!(!senders.offer(outgoing("http://ok.example/late")), "a full queue drops");
    }
}
