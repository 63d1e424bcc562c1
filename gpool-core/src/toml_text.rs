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
            err.message().to_string(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_count_from_one() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 99), 3);
    }
}
