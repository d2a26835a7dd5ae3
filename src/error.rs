//! Showing an error with its causes.
//!
//! The error types of this crate (`thiserror` enums) say in their own message what failed and
//! with what value, and keep the cause as their `source()`, which the message does not repeat.
//! [`Chain`] writes the whole story on one line: `what failed: why: the errno`.

use std::error::Error;
use std::fmt;

/// Displays an error followed by each of its sources, separated by `": "`. A source whose text
/// the line already holds (an error of another crate that shows its cause and returns it as its
/// source too) is not written again.
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = self.0.to_string();
        let mut source = self.0.source();
        while let Some(e) = source {
            let text = e.to_string();
            if !text.is_empty() && !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            source = e.source();
        }
        f.write_str(&line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open {0}")]
    struct Open(&'static str, #[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("shown: {0}")]
    struct Shows(#[source] std::io::Error);

    #[test]
    fn causes_follow_the_message() {
        let e = Open("/x", std::io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            Chain(&e).to_string(),
            "cannot open /x: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_cause_already_shown_is_not_repeated() {
        let e = Shows(std::io::Error::other("inner"));
        assert_eq!(Chain(&e).to_string(), "shown: inner");
    }
}
