//! Transition table tests for the job state machine.

use super::*;
use crate::ids::JobId;
use crate::testing::job_builder;

fn placement() -> Vec<NodePlacement> {
    vec![NodePlacement {
        node: "n1".into(),
        gpu_indices: vec![0, 1],
    }]
}

fn start(epoch: u64, now: i64) -> JobEvent {
    JobEvent::Start {
        epoch: Epoch(epoch),
        placement: placement(),
        burst: true,
        now: Timestamp(now),
    }
}

fn exited(epoch: u64, status: ExitStatus) -> JobEvent {
    JobEvent::Exited {
        epoch: Epoch(epoch),
        status,
        now: Timestamp(50),
    }
}

#[test]
fn run_to_completion_counts_the_attempt() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(7, 10)).unwrap();
    assert_eq!(job.n_attempts, 1);
    job.apply(&exited(7, ExitStatus::Code(0))).unwrap();
    assert_eq!(
        job.state,
        JobState::Completed {
            started_at: Timestamp(10),
            ended_at: Timestamp(50)
        }
    );
}

#[test]
fn non_zero_exit_and_signal_fail_with_codes() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(1, 10)).unwrap();
    job.apply(&exited(1, ExitStatus::Code(3))).unwrap();
    assert!(matches!(job.state, JobState::Failed { exit_code: Some(3), .. }));

    let mut job = job_builder(JobId(2)).build();
    job.apply(&start(2, 10)).unwrap();
    job.apply(&exited(2, ExitStatus::Signal(9))).unwrap();
    assert!(matches!(
        job.state,
        JobState::Failed {
            exit_code: Some(137),
            ..
        }
    ));
}

#[test]
fn stale_epoch_is_refused_and_leaves_the_state_alone() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(5, 10)).unwrap();
    let before = job.state.clone();
    let err = job.apply(&exited(4, ExitStatus::Code(0))).unwrap_err();
    assert_eq!(err.to_string(), "a running job cannot take the event exited");
    assert_eq!(job.state, before);
}

#[test]
fn lost_attempt_requeues_or_fails() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(1, 10)).unwrap();
    let lost = |requeue| JobEvent::Lost {
        epoch: Epoch(1),
        requeue,
        silent: false,
        now: Timestamp(20),
    };
    job.apply(&lost(true)).unwrap();
    assert_eq!(job.state, JobState::Pending);
    job.apply(&start(2, 30)).unwrap();
    assert_eq!(job.n_attempts, 2);
    assert!(job.apply(&lost(true)).is_err(), "epoch 1 is stale now");
    job.apply(&JobEvent::Lost {
        epoch: Epoch(2),
        requeue: false,
        silent: false,
        now: Timestamp(40),
    })
    .unwrap();
    assert!(matches!(job.state, JobState::NodeFail { .. }), "{:?}", job.state);
}

#[test]
fn cancel_ends_pending_and_running_jobs_but_not_finished_ones() {
    let cancel = JobEvent::Cancel {
        by: "alice".into(),
        now: Timestamp(9),
    };
    let mut pending = job_builder(JobId(1)).build();
    pending.apply(&cancel).unwrap();
    assert_eq!(pending.state.name(), "cancelled");
    assert!(pending.apply(&cancel).is_err());

    let mut running = job_builder(JobId(2)).build();
    running.apply(&start(1, 5)).unwrap();
    running.apply(&cancel).unwrap();
    assert_eq!(running.state.started_at(), Some(Timestamp(5)));
    assert_eq!(running.state.ended_at(), Some(Timestamp(9)));
}

#[test]
fn finished_jobs_take_no_events() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(1, 10)).unwrap();
    job.apply(&exited(1, ExitStatus::Code(0))).unwrap();
    for event in [start(2, 60), exited(1, ExitStatus::Code(1))] {
        assert!(job.apply(&event).is_err());
    }
}

#[test]
fn a_preempted_attempt_requeues_however_it_ends_and_counts_lost_work() {
    for end in [
        exited(3, ExitStatus::Code(0)),
        exited(3, ExitStatus::Code(1)),
        exited(3, ExitStatus::Signal(15)),
        JobEvent::FailedToStart {
            epoch: Epoch(3),
            reason: "x".into(),
            now: Timestamp(50),
        },
    ] {
        let mut job = job_builder(JobId(1)).build();
        job.apply(&start(3, 10_000)).unwrap();
        job.apply(&JobEvent::Checkpointed {
            epoch: Epoch(3),
            now: Timestamp(14_000),
        })
        .unwrap();
        job.apply(&JobEvent::Preempt {
            epoch: Epoch(3),
            now: Timestamp(20_000),
            by_operator: false,
        })
        .unwrap();
        // Counted once it takes effect, when the attempt ends.
        assert_eq!((job.n_preemptions, job.lost_gpu_secs), (0, 0));
        assert!(matches!(
            job.state,
            JobState::Running {
                preempted_at: Some(Timestamp(20_000)),
                burst: true,
                ..
            }
        ));
        // A second preemption of the same attempt is refused.
        assert!(job
            .apply(&JobEvent::Preempt {
                epoch: Epoch(3),
                now: Timestamp(21_000),
                by_operator: false,
            })
            .is_err());
        job.apply(&end).unwrap();
        assert_eq!(job.state, JobState::Pending, "after {end:?}");
        // Two GPUs, six seconds since the checkpoint before the signal.
        assert_eq!((job.n_preemptions, job.lost_gpu_secs), (1, 12));
        assert_eq!(job.requeue_cause, Some(crate::model::RequeueCause::Preempted));
    }
    // Without a preemption, a checkpoint changes nothing else.
    let mut job = job_builder(JobId(2)).build();
    job.apply(&start(4, 10)).unwrap();
    job.apply(&JobEvent::Checkpointed {
        epoch: Epoch(4),
        now: Timestamp(20),
    })
    .unwrap();
    job.apply(&exited(4, ExitStatus::Code(0))).unwrap();
    assert!(matches!(job.state, JobState::Completed { .. }));
}

#[test]
fn an_interactive_session_taken_back_or_lost_ends_instead_of_waiting_again() {
    for end in [
        exited(3, ExitStatus::Signal(10)),
        JobEvent::Lost {
            epoch: Epoch(3),
            requeue: true,
            silent: false,
            now: Timestamp(20_000),
        },
    ] {
        let mut job = job_builder(JobId(1)).build();
        std::sync::Arc::make_mut(&mut job.spec).pty = Some(crate::model::TerminalSize { rows: 24, cols: 80 });
        job.apply(&start(3, 10_000)).unwrap();
        let preempted = matches!(end, JobEvent::Exited { .. });
        if preempted {
            job.apply(&JobEvent::Preempt {
                epoch: Epoch(3),
                now: Timestamp(20_000),
                by_operator: false,
            })
            .unwrap();
        }
        job.apply(&end).unwrap();
        let JobState::Failed { reason, exit_code, .. } = &job.state else {
            panic!("after {end:?}: {:?}", job.state);
        };
        assert!(reason.contains("interactive session"), "{reason}");
        assert_eq!(*exit_code, None);
        // A preemption still counts as one.
        assert_eq!(job.n_preemptions, u32::from(preempted));
    }
}

#[test]
fn a_rescinded_preemption_runs_on_uncounted_and_may_come_again() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(3, 10_000)).unwrap();
    let preempt = |at: i64| JobEvent::Preempt {
        epoch: Epoch(3),
        now: Timestamp(at),
        by_operator: false,
    };
    let rescind = JobEvent::Rescind {
        epoch: Epoch(3),
        now: Timestamp(25_000),
    };
    // Nothing to rescind before a preemption.
    assert!(job.apply(&rescind).is_err());
    job.apply(&preempt(20_000)).unwrap();
    job.apply(&rescind).unwrap();
    assert!(matches!(job.state, JobState::Running { preempted_at: None, .. }));
    assert_eq!((job.n_preemptions, job.lost_gpu_secs, job.requeue_cause), (0, 0, None));
    // Taken again later, it counts once, from its start (no checkpoint).
    job.apply(&preempt(30_000)).unwrap();
    job.apply(&exited(3, ExitStatus::Code(0))).unwrap();
    assert_eq!(job.state, JobState::Pending);
    assert_eq!((job.n_preemptions, job.lost_gpu_secs), (1, 40));
}

#[test]
fn a_checkpoint_in_the_grace_loses_nothing() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(3, 10_000)).unwrap();
    job.apply(&JobEvent::Preempt {
        epoch: Epoch(3),
        now: Timestamp(20_000),
        by_operator: false,
    })
    .unwrap();
    job.apply(&JobEvent::Checkpointed {
        epoch: Epoch(3),
        now: Timestamp(21_000),
    })
    .unwrap();
    job.apply(&exited(3, ExitStatus::Code(0))).unwrap();
    assert_eq!((job.n_preemptions, job.lost_gpu_secs), (1, 0));
}

fn lost(epoch: u64) -> JobEvent {
    JobEvent::Lost {
        epoch: Epoch(epoch),
        requeue: true,
        silent: true,
        now: Timestamp(30),
    }
}

fn late_exit(epoch: u64, status: ExitStatus) -> JobEvent {
    JobEvent::LateExit {
        epoch: Epoch(epoch),
        status,
        now: Timestamp(60),
    }
}

#[test]
fn a_lost_attempt_that_finished_ends_the_requeued_job() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(1, 10)).unwrap();
    job.apply(&lost(1)).unwrap();
    assert_eq!(job.state, JobState::Pending);
    job.apply(&late_exit(1, ExitStatus::Code(0))).unwrap();
    assert_eq!(
        job.state,
        JobState::Completed {
            started_at: Timestamp(10),
            ended_at: Timestamp(60)
        }
    );
    assert!(job.lost_attempts.is_empty());
    // Reported twice: the second changes nothing.
    assert!(job.apply(&late_exit(1, ExitStatus::Code(0))).is_err());
}

#[test]
fn a_late_end_beats_the_newer_attempt_that_runs() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(1, 10)).unwrap();
    job.apply(&lost(1)).unwrap();
    job.apply(&start(2, 40)).unwrap();
    job.apply(&late_exit(1, ExitStatus::Code(4))).unwrap();
    assert!(matches!(
        job.state,
        JobState::Failed {
            exit_code: Some(4),
            started_at: Some(Timestamp(10)),
            ..
        }
    ));
}

#[test]
fn only_lost_attempts_may_report_late() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(1, 10)).unwrap();
    // Never lost: a stale end of some other epoch.
    assert!(job.apply(&late_exit(9, ExitStatus::Code(0))).is_err());
    // A preempted attempt that is lost is not remembered.
    job.apply(&JobEvent::Preempt {
        epoch: Epoch(1),
        now: Timestamp(20),
        by_operator: false,
    })
    .unwrap();
    job.apply(&lost(1)).unwrap();
    assert!(job.lost_attempts.is_empty());
    // A cancelled job takes no late end.
    job.apply(&start(2, 40)).unwrap();
    job.apply(&lost(2)).unwrap();
    job.apply(&JobEvent::Cancel {
        by: "u".into(),
        now: Timestamp(45),
    })
    .unwrap();
    assert!(job.apply(&late_exit(2, ExitStatus::Code(0))).is_err());
}

#[test]
fn a_time_limit_end_is_a_failure_that_says_so() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(1, 10)).unwrap();
    job.apply(&JobEvent::TimedOut {
        epoch: Epoch(1),
        now: Timestamp(20),
    })
    .unwrap();
    assert_eq!(
        job.state,
        JobState::Timeout {
            started_at: Timestamp(10),
            ended_at: Timestamp(20)
        }
    );
    assert!(job.state.is_finished());
}

#[test]
fn attempts_gpoold_ended_itself_are_not_remembered_as_lost() {
    let mut job = job_builder(JobId(1)).build();
    job.apply(&start(1, 10)).unwrap();
    job.apply(&JobEvent::Lost {
        epoch: Epoch(1),
        requeue: true,
        silent: false,
        now: Timestamp(20),
    })
    .unwrap();
    assert!(job.apply(&late_exit(1, ExitStatus::Signal(15))).is_err());
}

#[test]
fn lost_attempts_are_bounded() {
    let mut job = job_builder(JobId(1)).build();
    for epoch in 1..=10 {
        job.apply(&start(epoch, 10)).unwrap();
        job.apply(&lost(epoch)).unwrap();
    }
    assert_eq!(job.lost_attempts.len(), crate::model::MAX_LOST_ATTEMPTS);
    assert_eq!(job.lost_attempts.last().unwrap().epoch, Epoch(10));
}

fn limited(limit_secs: u64, checkpoints: bool) -> Job {
    let mut job = job_builder(JobId(1)).build();
    let spec = std::sync::Arc::make_mut(&mut job.spec);
    spec.time_limit_secs = Some(limit_secs);
    spec.checkpoint_signal = checkpoints.then_some(10);
    job
}

fn lost_at(epoch: u64, now_ms: i64) -> JobEvent {
    JobEvent::Lost {
        epoch: Epoch(epoch),
        requeue: true,
        silent: true,
        now: Timestamp(now_ms),
    }
}

/// A requeued job that checkpoints resumes, so its next attempt gets what
/// is left of its limit; one that does not starts over with all of it.
#[test]
fn a_requeue_gives_a_job_that_checkpoints_only_what_is_left_of_its_limit() {
    for (checkpoints, left_after) in [(true, 60), (false, 100)] {
        let mut job = limited(100, checkpoints);
        assert_eq!(job.time_left_secs(), Some(100));
        job.apply(&start(1, 0)).unwrap();
        job.apply(&lost_at(1, 40_000)).unwrap();
        assert_eq!(job.state, JobState::Pending);
        assert_eq!(job.time_left_secs(), Some(left_after), "checkpoints: {checkpoints}");
    }
    assert_eq!(job_builder(JobId(2)).build().time_left_secs(), None);
}

/// An attempt whose limit ran out before it was lost (its node went away
/// in the limit's grace) or taken back is not run again: the job ends as
/// timed out.
#[test]
fn an_attempt_lost_after_its_limit_ran_out_ends_the_job_as_timed_out() {
    for checkpoints in [true, false] {
        let mut job = limited(10, checkpoints);
        job.apply(&start(1, 1_000)).unwrap();
        job.apply(&lost_at(1, 15_000)).unwrap();
        assert_eq!(
            job.state,
            JobState::Timeout {
                started_at: Timestamp(1_000),
                ended_at: Timestamp(15_000)
            }
        );
    }
    // Preempted, then ended in its grace after the limit: the same.
    let mut job = limited(30, true);
    job.apply(&start(1, 0)).unwrap();
    job.apply(&lost_at(1, 20_000)).unwrap();
    job.apply(&start(2, 25_000)).unwrap();
    job.apply(&JobEvent::Preempt {
        epoch: Epoch(2),
        now: Timestamp(30_000),
        by_operator: false,
    })
    .unwrap();
    job.apply(&JobEvent::Exited {
        epoch: Epoch(2),
        status: ExitStatus::Code(0),
        now: Timestamp(36_000),
    })
    .unwrap();
    assert!(matches!(job.state, JobState::Timeout { .. }), "{:?}", job.state);
}

proptest::proptest! {
    /// However often a job that checkpoints is requeued, its attempts
    /// together never run longer than its limit before it ends.
    #[test]
    fn a_checkpointing_jobs_attempts_stay_within_its_limit(runs in proptest::collection::vec(0i64..50_000, 1..20)) {
        let mut job = limited(60, true);
        let mut now = 0;
        let mut total_ms = 0;
        for (n, ran) in runs.into_iter().enumerate() {
            let epoch = n as u64 + 1;
            if job.state != JobState::Pending {
                break;
            }
            let left = job.time_left_secs().unwrap();
            job.apply(&start(epoch, now)).unwrap();
            // The supervisor ends an attempt at its limit.
            let ran = ran.min(left as i64 * 1000);
            now += ran;
            total_ms += ran;
            job.apply(&lost_at(epoch, now)).unwrap();
            now += 1_000;
        }
        proptest::prop_assert!(total_ms <= 60_000);
    }
}
