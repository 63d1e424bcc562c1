//! Authorisation and token tests: the rules as examples, and properties
//! that no malformed or altered credential is ever accepted.

use super::token::*;
use super::*;
use crate::{Epoch, JobId, Timestamp};
use proptest::prelude::*;

const KEY: Key = [7; 32];

fn job<'a>(owner: &'a str, team: &'a str) -> JobRef<'a> {
    JobRef {
        id: JobId(7),
        owner,
        team,
    }
}

fn lead(user: &str, team: &str) -> Caller {
    Caller {
        led_teams: vec![team.to_string()],
        ..Caller::user(user)
    }
}

fn admin(user: &str) -> Caller {
    Caller {
        admin: true,
        ..Caller::user(user)
    }
}

#[test]
fn users_manage_their_own_jobs_leads_their_teams_and_admins_all() {
    let a_job = job("alice", "nlp");
    for action in [
        Action::ReadJob(a_job),
        Action::CancelJob(a_job),
        Action::SignalJob(a_job),
        Action::CheckpointJob(a_job),
    ] {
        assert!(authorize(&Caller::user("alice"), &action).is_ok());
        assert!(authorize(&lead("carol", "nlp"), &action).is_ok());
        assert!(authorize(&admin("root"), &action).is_ok());
        assert!(authorize(&lead("carol", "vision"), &action).is_err());
        assert!(authorize(&Caller::user("bob"), &action).is_err());
    }
    let err = authorize(&Caller::user("bob"), &Action::CancelJob(a_job)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "user bob may not cancel job 7 of user alice (team nlp): only its owner, a lead of team nlp or an admin may"
    );
}

#[test]
fn only_its_owner_or_an_admin_types_at_an_interactive_job() {
    let a_job = job("alice", "nlp");
    let action = Action::TypeInto(a_job);
    assert!(authorize(&Caller::user("alice"), &action).is_ok());
    assert!(authorize(&admin("root"), &action).is_ok());
    let err = authorize(&lead("carol", "nlp"), &action).unwrap_err();
    assert_eq!(
        err.to_string(),
        "user carol may not type at the terminal of job 7 of user alice (team nlp): only its owner or an admin may"
    );
    assert!(authorize(&Caller::user("bob"), &action).is_err());
}

#[test]
fn only_admins_run_the_pool() {
    for action in [
        Action::DrainNode("n1"),
        Action::ResumeNode("n1"),
        Action::ReloadPolicy,
        Action::ManageTokens,
        Action::InjectFault("n1"),
    ] {
        assert!(authorize(&admin("root"), &action).is_ok());
        let err = authorize(&lead("carol", "nlp"), &action).unwrap_err();
        assert_eq!(err.reason, "only admins may");
    }
    let err = authorize(&Caller::user("bob"), &Action::DrainNode("n1")).unwrap_err();
    assert_eq!(err.to_string(), "user bob may not drain node n1: only admins may");
}

#[test]
fn submit_needs_membership_and_a_bounded_priority() {
    let members = ["alice".to_string()];
    let submit = |team, members: &'static [String], priority| Action::Submit {
        team,
        members,
        priority,
        max_user_priority: 100,
    };
    let members: &'static [String] = Box::leak(Box::new(members));
    assert!(authorize(&Caller::user("alice"), &submit("nlp", members, 100)).is_ok());
    assert!(authorize(&Caller::user("alice"), &submit("nlp", members, -5)).is_ok());
    assert!(authorize(&Caller::user("bob"), &submit("open", &[], 0)).is_ok());
    assert!(authorize(&lead("carol", "nlp"), &submit("nlp", members, 0)).is_ok());
    let err = authorize(&Caller::user("bob"), &submit("nlp", members, 0)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "user bob may not submit to team nlp: team nlp has members alice only"
    );
    let err = authorize(&Caller::user("alice"), &submit("nlp", members, 1_000_000)).unwrap_err();
    assert_eq!(
        err.reason,
        "priority is above max_user_priority (100); only admins go beyond it"
    );
    assert!(authorize(&admin("root"), &submit("nlp", members, 1_000_000)).is_ok());
}

#[test]
fn an_agent_speaks_only_for_its_own_node_and_only_as_allowed() {
    let cert = |node, revoked| AgentCredential::Certificate { node, revoked };
    assert_eq!(admit_agent_link(&cert("n1", false)), Ok(()));
    assert_eq!(
        admit_agent_link(&cert("n1", true)),
        Err("the certificate of node n1 is revoked".into())
    );
    assert!(admit_agent_link(&AgentCredential::NoCertificate).is_err());
    let plain = |local_uid, insecure_allowed| AgentCredential::Plaintext {
        local_uid,
        controller_uid: 1000,
        insecure_allowed,
    };
    assert!(admit_agent_link(&plain(Some(0), false)).is_ok());
    assert!(admit_agent_link(&plain(Some(1000), false)).is_ok());
    assert!(
        admit_agent_link(&plain(Some(65534), true)).is_err(),
        "another local user, whatever the config"
    );
    assert!(admit_agent_link(&plain(None, false)).is_err());
    assert!(admit_agent_link(&plain(None, true)).is_ok());
    assert_eq!(agent_speaks_for(Some("n1"), "n1"), Ok(()));
    assert_eq!(agent_speaks_for(None, "n9"), Ok(()));
    assert_eq!(
        agent_speaks_for(Some("n2"), "n9"),
        Err("the agent's certificate is for node n2, but it registers as n9".into())
    );
}

fn record(secret: &[u8; SECRET_LEN], role: Role) -> TokenRecord {
    TokenRecord {
        id: 42,
        user: "alice".into(),
        role,
        teams: vec!["nlp".into()],
        created_by: "root".into(),
        created_at: Timestamp(0),
        expires_at: Some(Timestamp(1_000)),
        revoked_at: None,
        hash: secret_hash(&KEY, 42, secret),
    }
}

#[test]
fn a_user_token_round_trips_and_is_checked_against_its_record() {
    let secret = [9u8; SECRET_LEN];
    let text = user_token_text(42, &secret);
    assert_eq!(parse(&text), Ok(Credential::User { id: 42, secret }));
    assert!(!record(&secret, Role::User).hash.contains(&hex(&secret)));
    let caller = check_user_token(&KEY, &record(&secret, Role::Lead), &secret, Timestamp(999)).unwrap();
    assert_eq!(caller.led_teams, ["nlp"]);
    assert!(!caller.admin);
    let caller = check_user_token(&KEY, &record(&secret, Role::User), &secret, Timestamp(999)).unwrap();
    assert!(caller.led_teams.is_empty(), "a user token leads nothing");
    assert_eq!(
        check_user_token(&KEY, &record(&secret, Role::User), &secret, Timestamp(1_000)),
        Err(TokenError::Expired {
            id: 42,
            at: Timestamp(1_000)
        })
    );
    let mut revoked = record(&secret, Role::Admin);
    revoked.revoked_at = Some(Timestamp(5));
    assert_eq!(
        check_user_token(&KEY, &revoked, &secret, Timestamp(6)),
        Err(TokenError::Revoked(42))
    );
    assert_eq!(
        check_user_token(&[8; 32], &record(&secret, Role::User), &secret, Timestamp(6)),
        Err(TokenError::Wrong(42)),
        "another controller key gives another hash"
    );
}

#[test]
fn a_job_token_acts_as_its_owner_only_while_its_attempt_runs() {
    let text = job_token_text(&KEY, JobId(3), Epoch(11));
    let Ok(Credential::Job { job, epoch, mac }) = parse(&text) else {
        panic!("{text} does not parse")
    };
    let caller = check_job_token(&KEY, job, epoch, &mac, Some(Epoch(11)), "alice").unwrap();
    assert_eq!(caller, Caller::user("alice"));
    assert_eq!(
        check_job_token(&KEY, job, epoch, &mac, Some(Epoch(12)), "alice"),
        Err(TokenError::JobNotRunning { job: JobId(3) })
    );
    assert!(check_job_token(&KEY, JobId(4), epoch, &mac, Some(Epoch(11)), "alice").is_err());
}

#[test]
fn malformed_tokens_name_what_is_wrong() {
    for text in [
        "",
        "hunter2",
        "gpool_",
        "gpool_x_00",
        "gpool_1_zz",
        "gpoolj_1_2",
        "gpool_-1_0000000000000000000000000000000000000000000000000000000000000000",
        "gpool_99999999999999999999999_0000000000000000000000000000000000000000000000000000000000000000",
    ] {
        assert!(matches!(parse(text), Err(TokenError::Malformed(_))), "{text:?}");
    }
}

/// `text` with the character at `position` (modulo its length) replaced
/// by `replacement`'s first; `None` where that changes nothing.
fn alter(text: &str, position: usize, replacement: &str) -> Option<String> {
    let mut chars: Vec<char> = text.chars().collect();
    let position = position % chars.len();
    let new_char = replacement.chars().next()?;
    if chars[position] == new_char {
        return None;
    }
    chars[position] = new_char;
    Some(chars.into_iter().collect())
}

proptest! {
    #[test]
    fn parsing_any_text_never_panics(text in "\\PC{0,200}") {
        let _ = parse(&text);
    }

    #[test]
    fn no_altered_user_token_is_accepted(
        secret in proptest::array::uniform32(any::<u8>()),
        position in 0usize..70,
        replacement in "[0-9a-z_]",
    ) {
        let rec = record(&secret, Role::User);
        let altered = alter(&user_token_text(42, &secret), position, &replacement);
        prop_assume!(altered.is_some());
        let altered = altered.unwrap();
        let accepted = match parse(&altered) {
            Ok(Credential::User { id: 42, secret }) => check_user_token(&KEY, &rec, &secret, Timestamp(0)).is_ok(),
            _ => false,
        };
        prop_assert!(!accepted, "{altered} was accepted");
    }

    #[test]
    fn no_altered_job_token_is_accepted(job in 0u64..1000, epoch in 0u64..1000, position in 0usize..90, replacement in "[0-9a-f_]") {
        let altered = alter(&job_token_text(&KEY, JobId(job), Epoch(epoch)), position, &replacement);
        prop_assume!(altered.is_some());
        let altered = altered.unwrap();
        // An altered text may still name the same job and epoch (a leading
        // zero); then it is the same credential. Any other must fail.
        if let Ok(Credential::Job { job: parsed_job, epoch: parsed_epoch, mac }) = parse(&altered) {
            let accepted = check_job_token(&KEY, parsed_job, parsed_epoch, &mac, Some(parsed_epoch), "alice").is_ok();
            prop_assert!(!accepted || (parsed_job, parsed_epoch) == (JobId(job), Epoch(epoch)), "{altered} was accepted");
        }
    }

    #[test]
    fn nobody_but_an_admin_runs_the_pool(user in "[a-z]{1,8}", teams in proptest::collection::vec("[a-z]{1,4}", 0..3)) {
        let caller = Caller { user, admin: false, led_teams: teams };
        for action in [Action::DrainNode("n"), Action::ResumeNode("n"), Action::ReloadPolicy, Action::ManageTokens, Action::ManageReservations, Action::InjectFault("n")] {
            prop_assert!(authorize(&caller, &action).is_err());
        }
    }

    #[test]
    fn a_user_reaches_another_users_job_only_as_its_teams_lead(
        user in "[a-z]{1,3}", owner in "[a-z]{1,3}", team in "[a-z]{1,2}", led in proptest::collection::vec("[a-z]{1,2}", 0..3),
    ) {
        let caller = Caller { user: user.clone(), admin: false, led_teams: led.clone() };
        let allowed = authorize(&caller, &Action::CancelJob(JobRef { id: JobId(1), owner: &owner, team: &team })).is_ok();
        prop_assert_eq!(allowed, user == owner || led.contains(&team));
    }
}

#[test]
fn owners_shorten_and_admins_lengthen_a_pending_job() {
    let a_job = job("alice", "nlp");
    let update = |longer_time, priority| Action::UpdateJob {
        job: a_job,
        longer_time,
        priority,
        max_user_priority: 100,
    };
    assert!(authorize(&Caller::user("alice"), &update(false, Some(50))).is_ok());
    assert!(authorize(&lead("lee", "nlp"), &update(false, None)).is_ok());
    let err = authorize(&Caller::user("alice"), &update(true, None)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "user alice may not update job 7 of user alice (team nlp): only admins may make a time limit longer"
    );
    let err = authorize(&Caller::user("alice"), &update(false, Some(101))).unwrap_err();
    assert!(err.reason.contains("max_user_priority (100)"), "{err}");
    let err = authorize(&Caller::user("bob"), &update(false, None)).unwrap_err();
    assert!(err.reason.contains("only its owner"), "{err}");
    assert!(authorize(&admin("root"), &update(true, Some(1_000))).is_ok());
}

#[test]
fn token_refusals_reveal_nothing_of_what_exists() {
    // A token id that does not exist reads as a wrong one.
    assert_eq!(TokenError::Unknown(9).to_string(), TokenError::Wrong(9).to_string());
    // A forged job token is wrong, whether or not its job runs.
    let forged = [0u8; 32];
    for running in [None, Some(Epoch(3))] {
        assert_eq!(
            check_job_token(&KEY, JobId(5), Epoch(3), &forged, running, "alice"),
            Err(TokenError::WrongJobToken {
                job: JobId(5),
                epoch: Epoch(3)
            })
        );
    }
}
