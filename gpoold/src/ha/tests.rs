//! When a leader's own key in etcd says it leads no more, and etcd's errors in words.

use super::*;

fn ours() -> KeySeen {
    KeySeen {
        create_revision: 41,
        lease: 0x7a,
        value: "ctl-a ctl-a.example:7070".into(),
    }
}

#[test]
fn a_leader_leads_while_its_key_is_the_one_it_was_elected_with() {
    assert_eq!(deposed(&ours(), Some(&ours())), None);
}

#[test]
fn a_leader_whose_key_is_gone_or_names_another_steps_down() {
    assert_eq!(
        deposed(&ours(), None).as_deref(),
        Some("its leader key is gone from etcd")
    );
    let other = KeySeen {
        value: "ctl-b ctl-b.example:7070".into(),
        ..ours()
    };
    let why = deposed(&ours(), Some(&other)).unwrap_or_default();
    assert!(why.contains("names \"ctl-b ctl-b.example:7070\" now"), "{why}");
    // The same words, put again: not the key that elected it.
    let again = KeySeen {
        create_revision: 57,
        ..ours()
    };
    let why = deposed(&ours(), Some(&again)).unwrap_or_default();
    assert!(why.contains("written again (created at revision 57"), "{why}");
    let detached = KeySeen { lease: 0, ..ours() };
    assert!(deposed(&ours(), Some(&detached)).is_some());
}

#[test]
fn a_refused_client_certificate_is_named_with_the_fields_to_set() {
    let raw = "grpc request error: code: 'Unknown error', message: \"transport error\", source: \
               tonic::transport::Error(Transport, hyper::Error(Io, Custom { kind: InvalidData, error: \"received fatal alert: BadCertificate\" }))";
    let words = etcd_error_words(raw);
    assert!(
        words.starts_with("etcd refused this controller's TLS client certificate: give ha.cert and ha.key"),
        "{words}"
    );
    assert_eq!(etcd_error_words("connection refused"), "connection refused");
}
