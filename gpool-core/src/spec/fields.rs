//! Checks of one field each: what a spec's command, names, paths,
//! variables and image may hold, from any source.

use super::*;

/// An output file pattern: a path (relative to the workdir) of at most
/// `MAX_PATH_BYTES`, without NUL or newlines.
pub(super) fn validate_output_path(field: &str, path: &str) -> Result<(), SpecError> {
    if path.len() > MAX_PATH_BYTES {
        return Err(spec_error(
            field,
            format!("{} bytes, more than the limit of {MAX_PATH_BYTES}", path.len()),
        ));
    }
    if path.contains(['\0', '\n']) {
        return Err(spec_error(field, "a path has no NUL or newline characters"));
    }
    if let Some(unknown) = crate::array::unknown_pattern_field(path) {
        return Err(spec_error(
            field,
            format!(
                "%{unknown} in {path:?} is not a pattern field (%j job, %A array, %a task, %n node, %t rank, %u user, %x name, %% a %)"
            ),
        ));
    }
    Ok(())
}

/// An image reference as registries and runtimes take it:
/// `[host[:port]/]path[:tag][@digest]`, letters, digits and `._-/:@`.
pub(super) fn validate_image(image: &str) -> Result<(), SpecError> {
    let ok = image.len() <= 255
        && !image.starts_with('-')
        && image
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':' | '@'));
    if ok {
        Ok(())
    } else {
        Err(spec_error(
            "image",
            format!("{image:?} is not an image reference (letters, digits, '._-/:@', at most 255)"),
        ))
    }
}

pub(super) fn validate_name(name: &str) -> Result<(), SpecError> {
    if name.is_empty() {
        return Err(spec_error("name", "must not be empty"));
    }
    if name.chars().count() > MAX_NAME_LEN {
        return Err(spec_error("name", format!("longer than {MAX_NAME_LEN} characters")));
    }
    if name.chars().any(char::is_control) {
        return Err(spec_error("name", "contains a control character"));
    }
    Ok(())
}

pub(super) fn validate_command(command: &[String]) -> Result<(), SpecError> {
    match command.first() {
        None => Err(spec_error("command", "is missing: give the program to run")),
        Some(program) if program.is_empty() => Err(spec_error("command", "the program is an empty string")),
        Some(_) if command.iter().any(|arg| arg.contains('\0')) => {
            Err(spec_error("command", "an argument contains a NUL byte"))
        }
        Some(_) if command.len() > MAX_ARGS => Err(spec_error(
            "command",
            format!("{} arguments, more than the limit of {MAX_ARGS}", command.len()),
        )),
        Some(_) => {
            // Linux counts the NUL that ends each string.
            if let Some((position, arg)) = command
                .iter()
                .enumerate()
                .find(|(_, arg)| arg.len() + 1 > MAX_ARG_BYTES)
            {
                return Err(spec_error(
                    "command",
                    format!(
                        "argument {position} is {} bytes, more than the limit of {MAX_ARG_BYTES}",
                        arg.len()
                    ),
                ));
            }
            let total: usize = command.iter().map(|arg| arg.len() + 1).sum();
            if total > MAX_COMMAND_BYTES {
                return Err(spec_error(
                    "command",
                    format!("{total} bytes in all, more than the limit of {MAX_COMMAND_BYTES}"),
                ));
            }
            Ok(())
        }
    }
}

pub(super) fn validate_ident(field: &str, value: &str) -> Result<(), SpecError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if value.is_empty() || value.len() > MAX_IDENT_LEN {
        return Err(spec_error(field, format!("must be 1 to {MAX_IDENT_LEN} characters")));
    }
    match value.chars().find(|c| !allowed(*c)) {
        Some(bad) => Err(spec_error(
            field,
            format!("{value:?} contains {bad:?}; use letters, digits, '.', '_' and '-'"),
        )),
        None => Ok(()),
    }
}

pub(super) fn validate_env(name: &str, value: &str) -> Result<(), SpecError> {
    const MAX_ENV_NAME: usize = 256;
    if name.len() > MAX_ENV_NAME {
        return Err(spec_error(
            "env",
            format!(
                "a variable name of {} bytes, more than the limit of {MAX_ENV_NAME}",
                name.len()
            ),
        ));
    }
    let field = format!("env.{name}");
    let mut chars = name.chars();
    let starts_well = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !starts_well || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(spec_error(
            &field,
            "a variable name is letters, digits and '_', not starting with a digit",
        ));
    }
    if name.starts_with("GPOOL_") || name == "CUDA_VISIBLE_DEVICES" || name == "CUDA_DEVICE_ORDER" {
        return Err(spec_error(&field, "is set by gpool for each attempt"));
    }
    if value.contains('\0') {
        return Err(spec_error(&field, "the value contains a NUL byte"));
    }
    // NAME=VALUE and its NUL, as exec counts it.
    if name.len() + value.len() + 2 > MAX_ARG_BYTES {
        return Err(spec_error(
            &field,
            format!(
                "{} bytes, more than the limit of {MAX_ARG_BYTES} for one variable",
                name.len() + value.len() + 2
            ),
        ));
    }
    Ok(())
}

pub(super) fn validate_workdir(workdir: &str) -> Result<(), SpecError> {
    if workdir.is_empty() {
        return Ok(());
    }
    if !workdir.starts_with('/') {
        return Err(spec_error("workdir", format!("{workdir:?} is not an absolute path")));
    }
    if workdir.contains('\0') {
        return Err(spec_error("workdir", "contains a NUL byte"));
    }
    if workdir.len() > MAX_PATH_BYTES {
        return Err(spec_error(
            "workdir",
            format!("{} bytes, more than the limit of {MAX_PATH_BYTES}", workdir.len()),
        ));
    }
    Ok(())
}

/// A name as `[[reservation]]` gives them: letters, digits, `.`, `_`, `-`.
pub(super) fn name_ok_for_reservation(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_IDENT_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}
