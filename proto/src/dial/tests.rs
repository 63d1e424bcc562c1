//! Addresses, redirects and where a token may go in clear text.

use super::*;

#[test]
fn addresses_name_their_transport() {
    assert_eq!(
        Address::parse("unix:/run/g.sock"),
        Ok(Address::Unix("/run/g.sock".into()))
    );
    assert_eq!(
        Address::parse("https://ctl.example:7070"),
        Ok(Address::Tcp {
            host_port: "ctl.example:7070".into(),
            tls: Some(true)
        })
    );
    assert_eq!(
        Address::parse("10.0.0.1:7070"),
        Ok(Address::Tcp {
            host_port: "10.0.0.1:7070".into(),
            tls: None
        })
    );
    assert!(Address::parse("ftp://x:1").is_err());
    assert!(Address::parse("nowhere").is_err());
    assert!(Address::parse("unix:").is_err());
}

#[test]
fn a_list_names_each_controller_in_turn() {
    let list = parse_list("10.0.0.1:7070, https://b.example:7070").unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[1].text(), "https://b.example:7070");
    assert_eq!(
        parse_list("unix:/run/g.sock").unwrap(),
        vec![Address::Unix("/run/g.sock".into())]
    );
    assert!(parse_list(" , ").is_err());
    assert!(parse_list("a:1,nowhere").is_err());
}

#[test]
fn a_redirect_keeps_the_transport_it_came_by() {
    let from = Address::parse("https://a.example:7070").unwrap();
    assert_eq!(
        redirected(&from, "b.example:7070").unwrap().text(),
        "https://b.example:7070"
    );
    let plain = Address::parse("http://a:1").unwrap();
    assert_eq!(redirected(&plain, "b:2").unwrap().text(), "http://b:2");
    // The caller's choice holds: no downgrade, no upgrade it did not ask for.
    assert_eq!(redirected(&from, "http://b:2").unwrap().text(), "https://b:2");
    assert_eq!(redirected(&plain, "https://b:2").unwrap().text(), "http://b:2");
    assert!(redirected(&plain, "unix:/run/x.sock").is_err());
    let err = redirected(&plain, "nowhere").unwrap_err();
    assert!(err.starts_with("http://a:1 names the leader at"), "{err}");
}

fn address(text: &str) -> Address {
    Address::parse(text).unwrap()
}

#[test]
fn a_token_goes_in_clear_text_only_over_loopback_or_where_the_caller_insists() {
    let no_ca = ClientTls::default();
    let with_ca = ClientTls {
        ca_pem: Some("a CA".into()),
        identity_pem: None,
    };
    let rule = TokenRule::for_addresses(&[address("127.0.0.1:1"), address("http://10.0.0.9:7070")]);
    for loopback in [
        "127.0.0.1:1",
        "127.3.0.1:2",
        "localhost:3",
        "[::1]:4",
        "http://127.0.0.1:5",
    ] {
        assert!(rule.allows(&address(loopback), &no_ca), "{loopback}");
    }
    assert!(!rule.allows(&address("10.0.0.5:7070"), &no_ca));
    assert!(!rule.allows(&address("http://10.0.0.5:7070"), &no_ca), "not named so");
    assert!(!rule.allows(&address("ctl.example:7070"), &no_ca));
    assert!(
        rule.allows(&address("http://10.0.0.9:7070"), &no_ca),
        "named with http://"
    );
    assert!(rule.allows(&address("10.0.0.5:7070"), &with_ca), "TLS with the CA");
    assert!(rule.allows(&address("https://10.0.0.5:7070"), &no_ca));
    assert!(
        !rule.allows(&address("http://10.0.0.5:7070"), &with_ca),
        "http:// is clear text"
    );
    assert!(rule.allows(&address("unix:/run/g.sock"), &no_ca));
}

#[test]
fn a_redirect_to_a_leader_beyond_loopback_keeps_a_token_out_of_clear_text() {
    let no_ca = ClientTls::default();
    let standby = address("127.0.0.1:7071");
    let rule = TokenRule::for_addresses(std::slice::from_ref(&standby));
    assert_eq!(
        follow(&standby, "10.0.0.5:7070", &no_ca, Some(&rule)),
        Err(DialError::ClearTextRedirect {
            standby: "127.0.0.1:7071".into(),
            leader: "10.0.0.5:7070".into()
        })
    );
    // Whatever scheme the standby names: the leader's transport is the
    // caller's.
    assert!(follow(&standby, "http://10.0.0.5:7070", &no_ca, Some(&rule)).is_err());
    // http:// for the standby insists on clear text to it, not beyond.
    let insisted = address("http://127.0.0.1:7071");
    let on_loopback = TokenRule::for_addresses(std::slice::from_ref(&insisted));
    assert!(follow(&insisted, "10.0.0.5:7070", &no_ca, Some(&on_loopback)).is_err());
    // Where the caller names the leader with http:// too, or the leader is
    // on loopback, or the CA makes it TLS, the redirect is followed.
    let both = TokenRule::for_addresses(&[standby.clone(), address("http://10.0.0.5:7070")]);
    assert_eq!(
        follow(&standby, "10.0.0.5:7070", &no_ca, Some(&both)).map(|next| next.text()),
        Ok("10.0.0.5:7070".to_string())
    );
    assert!(follow(&standby, "127.0.0.1:7070", &no_ca, Some(&rule)).is_ok());
    let with_ca = ClientTls {
        ca_pem: Some("a CA".into()),
        identity_pem: None,
    };
    assert!(follow(&standby, "10.0.0.5:7070", &with_ca, Some(&rule)).is_ok());
    // A caller with no token (an agent) follows the standby as it came.
    assert_eq!(
        follow(&standby, "10.0.0.5:7070", &no_ca, None).map(|next| next.text()),
        Ok("10.0.0.5:7070".to_string())
    );
}
