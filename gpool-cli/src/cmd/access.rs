//! `gpool whoami` and `gpool admin token create|list|revoke`.

use super::Ctx;
use crate::output::{print_json, rfc3339};
use crate::CliError;
use gpool_proto::pb;

pub async fn whoami(ctx: &Ctx) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let me = conn
        .client
        .who_am_i(pb::WhoAmIRequest {})
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    if ctx.json() {
        print_json(&serde_json::json!({
            "user": me.user, "admin": me.admin, "led_teams": me.led_teams, "via": me.via,
        }));
    } else {
        let role = if me.admin {
            "admin".to_string()
        } else if me.led_teams.is_empty() {
            "user".to_string()
        } else {
            format!("lead of {}", me.led_teams.join(", "))
        };
        outln!("{} ({role}), identified by {}", me.user, me.via);
    }
    Ok(())
}

/// `gpool controllers`: who leads, who stands by.
pub async fn controllers(ctx: &Ctx) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let answer = conn
        .client
        .controllers(pb::ControllersRequest {})
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    let lease_left = |secs: i64| (secs >= 0).then_some(secs);
    if ctx.json() {
        let controllers: Vec<serde_json::Value> = answer
            .controllers
            .iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.name, "advertise": c.advertise, "leader": c.leader,
                    "lease_left_secs": lease_left(c.lease_left_secs),
                })
            })
            .collect();
        print_json(&serde_json::json!({"ha": answer.ha, "term": answer.term, "controllers": controllers}));
        return Ok(());
    }
    if !answer.ha {
        outln!(
            "one controller, without [ha]: {}",
            answer.controllers.first().map_or("", |c| c.advertise.as_str())
        );
        return Ok(());
    }
    let rows = answer
        .controllers
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                c.advertise.clone(),
                if c.leader {
                    format!("leader (term {})", answer.term)
                } else {
                    "standby".into()
                },
                lease_left(c.lease_left_secs).map_or("-".into(), |secs| format!("{secs}s")),
            ]
        })
        .collect();
    crate::output::print_table(&["NAME", "ADDRESS", "ROLE", "LEASE LEFT"], rows);
    Ok(())
}

pub async fn token_create(
    ctx: &Ctx,
    user: String,
    role: String,
    teams: Vec<String>,
    expires_secs: Option<u64>,
) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let created = conn
        .client
        .create_token(pb::CreateTokenRequest {
            user,
            role,
            teams,
            expires_in: expires_secs.map(|seconds| pb::Duration { seconds }),
        })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    let info = created.info.unwrap_or_default();
    if ctx.json() {
        let mut value = token_json(&info);
        value["token"] = created.token.into();
        print_json(&value);
    } else {
        // The token alone on stdout, so `> ~/.config/gpool/token` works.
        outln!("{}", created.token);
        eprintln!(
            "token {} for {} ({}{}); it is shown only now",
            info.id,
            info.user,
            info.role,
            info.expires_at_ms.map_or_else(
                || ", never expires".to_string(),
                |at| format!(", expires {}", rfc3339(at))
            )
        );
    }
    Ok(())
}

pub async fn token_list(ctx: &Ctx) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let tokens = conn
        .client
        .list_tokens(pb::ListTokensRequest {})
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner()
        .tokens;
    if ctx.json() {
        print_json(&serde_json::Value::Array(tokens.iter().map(token_json).collect()));
        return Ok(());
    }
    outln!(
        "{:<6} {:<16} {:<6} {:<16} {:<22} STATE",
        "ID",
        "USER",
        "ROLE",
        "TEAMS",
        "EXPIRES"
    );
    for token in &tokens {
        let state = match token.revoked_at_ms {
            Some(at) => format!("revoked {}", rfc3339(at)),
            None => "active".to_string(),
        };
        outln!(
            "{:<6} {:<16} {:<6} {:<16} {:<22} {state}",
            token.id,
            token.user,
            token.role,
            if token.teams.is_empty() {
                "-".to_string()
            } else {
                token.teams.join(",")
            },
            token.expires_at_ms.map_or_else(|| "never".to_string(), rfc3339),
        );
    }
    Ok(())
}

pub async fn token_revoke(ctx: &Ctx, id: u64) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let info = conn
        .client
        .revoke_token(pb::RevokeTokenRequest { id })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    if ctx.json() {
        print_json(&token_json(&info));
    } else {
        outln!("token {} of {} revoked", info.id, info.user);
    }
    Ok(())
}

fn token_json(token: &pb::TokenInfo) -> serde_json::Value {
    serde_json::json!({
        "id": token.id,
        "user": token.user,
        "role": token.role,
        "teams": token.teams,
        "created_by": token.created_by,
        "created_at": rfc3339(token.created_at_ms),
        "expires_at": token.expires_at_ms.map(rfc3339),
        "revoked_at": token.revoked_at_ms.map(rfc3339),
    })
}
