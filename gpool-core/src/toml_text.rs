//! TOML config text with errors that name the file, the line and the field.
//! Pure: callers read the file and pass its text.

use serde::de::DeserializeOwned;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {reason}")]
    Read { file: String, reason: String },
    #[error("{file}:{line}: {message}")]
    Invalid { file: String, line: usize, message: String },
}

/// The 1-based line of a byte offset.
pub fn line_of(text: &str, byte_offset: usize) -> usize {
    let end = byte_offset.min(text.len());
    text.as_bytes()[..end].iter().filter(|b| **b == b'\n').count() + 1
}

/// An `Invalid` error at `byte_offset` of `text`.
pub fn invalid(file: &str, text: &str, byte_offset: usize, message: String) -> ConfigError {
    ConfigError::Invalid {
        file: file.to_string(),
        line: line_of(text, byte_offset),
        message,
    }
}

/// Deserializes `text`; syntax errors and unknown fields come back with
/// their line.
pub fn parse<T: DeserializeOwned>(file: &str, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|err| {
        invalid(
            file,
            text,
            err.span().map_or(0, |span| span.start),
            message_of(&err, text),
        )
    })
}

/// The parser's message, with the key named where it names none (its
/// "duplicate key" points at the key but does not say which).
pub fn message_of(err: &toml::de::Error, text: &str) -> String {
    let message = err.message().trim().to_string();
    let key = err
        .span()
        .and_then(|span| text.get(span))
        .map(str::trim)
        .filter(|key| !key.is_empty() && key.len() <= 64 && !key.contains('\n'));
    match key {
        Some(key) if message == "duplicate key" => format!("duplicate key `{key}`"),
        _ => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicate_key_is_named() {
        let err = parse::<toml::Table>("f.toml", "a = 1\nb = 2\nb = 3\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("f.toml:3") && err.contains("duplicate key `b`"), "{err}");
    }

    #[test]
    fn lines_count_from_one() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 99), 3);
    }
}
