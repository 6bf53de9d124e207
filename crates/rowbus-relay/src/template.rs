//! Subjects, streams, routing keys and topics that name the message's group or key.

use crate::error::RelayError;

/// What a [`Template`] renders for the default group (`""`) and for a message without an
/// ordering key: a subject, stream, routing key or topic never has an empty part (NATS
/// refuses a subject with an empty token, `orders.`).
pub const MISSING: &str = "_";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Group,
    Key,
}

/// A subject, stream name, routing key or topic in which `{group}` stands for the
/// message's group and `{key}` for its ordering key: `orders.{group}`, `events-{key}`.
/// `{{` and `}}` are a literal brace; any other placeholder is refused. The default group
/// (`""`) and a missing key render as [`MISSING`] (`_`).
///
/// ```
/// use rowbus_relay::Template;
/// let subject = Template::parse("orders.{group}.{key}")?;
/// assert_eq!(subject.render("eu", Some("user-7")), "orders.eu.user-7");
/// assert_eq!(subject.render("", None), "orders._._");
/// # Ok::<(), rowbus_relay::RelayError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

impl Template {
    /// Reads a template; refuses an empty one, an unknown placeholder (`{id}`) and an
    /// unmatched brace.
    pub fn parse(source: &str) -> Result<Template, RelayError> {
        let refuse = |reason: String| RelayError::Template { template: source.to_owned(), reason };
        if source.is_empty() {
            return Err(refuse("it is empty".to_owned()));
        }
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut chars = source.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        name.push(c);
                    }
                    if !closed {
                        return Err(refuse("a '{' is never closed".to_owned()));
                    }
                    let part = match name.as_str() {
                        "group" => Part::Group,
                        "key" => Part::Key,
                        other => {
                            return Err(refuse(format!(
                                "unknown placeholder {{{other}}} (only {{group}} and {{key}}; {{{{ is a literal brace)"
                            )));
                        }
                    };
                    if !text.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut text)));
                    }
                    parts.push(part);
                }
                '}' => return Err(refuse("a '}' closes nothing (}} is a literal brace)".to_owned())),
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        Ok(Template { source: source.to_owned(), parts })
    }

    /// The text for one message: `{group}` replaced by `group` and `{key}` by `key`, each
    /// [`MISSING`] when empty or absent.
    pub fn render(&self, group: &str, key: Option<&str>) -> String {
        let or_missing = |s: &str| if s.is_empty() { MISSING.to_owned() } else { s.to_owned() };
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Group => out.push_str(&or_missing(group)),
                Part::Key => out.push_str(&or_missing(key.unwrap_or(""))),
            }
        }
        out
    }

    /// Whether it names the message's ordering key: messages of one group may render
    /// differently.
    pub fn names_key(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Key))
    }

    /// What it renders for a group and a key that are plain words (`x`): its own text, as
    /// every message has it, for the checks a broker's names must pass before any message
    /// is sent.
    pub fn sample(&self) -> String {
        self.render("x", Some("x"))
    }

    /// Whether it names neither the group nor the key: every message renders the same.
    pub fn is_fixed(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Text(_)))
    }

    /// The template as it was given.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl std::fmt::Display for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.source)
    }
}

impl std::str::FromStr for Template {
    type Err = RelayError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Template::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(source: &str) -> String {
        match Template::parse(source) {
            Err(RelayError::Template { reason, .. }) => reason,
            other => panic!("{source:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn placeholders_are_replaced() {
        let t = Template::parse("orders.{group}.{key}").unwrap();
        assert_eq!(t.render("eu", Some("user-7")), "orders.eu.user-7");
        assert!(!t.is_fixed());
        assert_eq!(Template::parse("{key}").unwrap().render("g", Some("k")), "k");
        assert_eq!(Template::parse("{group}{group}").unwrap().render("g", None), "gg");
    }

    #[test]
    fn the_default_group_and_a_missing_key_render_as_an_underscore() {
        let t = Template::parse("s.{group}.{key}").unwrap();
        assert_eq!(t.render("", None), "s._._");
        assert_eq!(t.render("g", Some("")), "s.g._");
    }

    #[test]
    fn a_template_without_placeholders_is_fixed() {
        let t = Template::parse("events").unwrap();
        assert!(t.is_fixed());
        assert_eq!(t.render("any", Some("thing")), "events");
        assert_eq!(t.to_string(), "events");
    }

    #[test]
    fn doubled_braces_are_literal() {
        let t = Template::parse("a{{b}}.{group}").unwrap();
        assert_eq!(t.render("g", None), "a{b}.g");
        assert!(Template::parse("{{group}}").unwrap().is_fixed());
    }

    #[test]
    fn unknown_placeholders_and_stray_braces_are_refused() {
        assert!(reason("orders.{id}").contains("unknown placeholder {id}"), "{}", reason("orders.{id}"));
        assert!(reason("orders.{}").contains("unknown placeholder {}"));
        assert!(reason("orders.{group").contains("never closed"));
        assert!(reason("orders.group}").contains("closes nothing"));
        assert!(reason("").contains("empty"));
    }
}
