//! Daemon-side uid/gid translation (`--translate-uid` / `--translate-gid`).
//!
//! The guest and the host may number their users differently. A translation rule tells the
//! daemon how to rewrite ids as requests go in (guest → host: the caller's credentials used to
//! create files, the owner a SETATTR sets) and as attributes come back (host → guest: every
//! `stat` the guest sees). The daemon does this itself, in [`MappedFs`]; no user namespace is
//! involved (compare `--uid-map`, documented in `doc/id-mapping.md`).
//!
//! # Rule syntax
//! One rule per flag occurrence, `<type>:<source base>:<target base>:<count>`:
//!
//! | rule | meaning |
//! | --- | --- |
//! | `guest:G:H:N` | guest ids `G..G+N` become host ids `H..H+N` (guest → host only) |
//! | `host:H:G:N` | host ids `H..H+N` appear as guest ids `G..G+N` (host → guest only) |
//! | `map:G:H:N` | both of the above at once |
//! | `squash-guest:G:H:N` | guest ids `G..G+N` all become host id `H` |
//! | `squash-host:H:G:N` | host ids `H..H+N` all appear as guest id `G` |
//! | `forbid-guest:G:N` | creating files as, or giving files to, guest ids `G..G+N` fails with `EPERM` |
//!
//! Ranges are half-open (`N` ids starting at the base). An id no rule covers passes through
//! unchanged. Rules are refused when they are malformed, when `N` is 0, when a range runs past
//! [`MAX_ID`] (`(uid_t)-1` is not an id), or when two rules cover the same id in the same
//! direction (guest → host: `guest`, `map`, `squash-guest`, `forbid-guest`; host → guest:
//! `host`, `map`, `squash-host`).
//!
//! Translation and POSIX ACLs do not mix (an ACL stores raw ids), so while any rule is active
//! [`MappedFs`] refuses the ACL extended attributes with `EOPNOTSUPP`.

pub mod fs;

use std::fmt;
use std::str::FromStr;

pub use fs::MappedFs;

/// The largest id a rule may cover: `u32::MAX` is `(uid_t)-1`, which is never an id.
pub const MAX_ID: u32 = u32::MAX - 1;

/// The accepted forms, quoted in every refusal.
pub const EXPECTED_FORM: &str = "<type>:<source base>:<target base>:<count> with type guest, \
     host, map, squash-guest or squash-host, or forbid-guest:<guest base>:<count> \
     (ids 0 to 4294967294; a count of 0 names no id)";

/// The kind of a rule: which way it translates and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleKind {
    /// `guest:G:H:N`: guest ids to host ids, 1:1.
    Guest,
    /// `host:H:G:N`: host ids to guest ids, 1:1.
    Host,
    /// `map:G:H:N`: both directions, 1:1.
    Map,
    /// `squash-guest:G:H:N`: a range of guest ids to one host id.
    SquashGuest,
    /// `squash-host:H:G:N`: a range of host ids to one guest id.
    SquashHost,
    /// `forbid-guest:G:N`: guest ids that may not own new files or be given files.
    ForbidGuest,
}

impl RuleKind {
    /// The name the rule starts with on the command line.
    pub fn name(self) -> &'static str {
        match self {
            RuleKind::Guest => "guest",
            RuleKind::Host => "host",
            RuleKind::Map => "map",
            RuleKind::SquashGuest => "squash-guest",
            RuleKind::SquashHost => "squash-host",
            RuleKind::ForbidGuest => "forbid-guest",
        }
    }

    fn from_name(s: &str) -> Option<RuleKind> {
        Some(match s {
            "guest" => RuleKind::Guest,
            "host" => RuleKind::Host,
            "map" => RuleKind::Map,
            "squash-guest" => RuleKind::SquashGuest,
            "squash-host" => RuleKind::SquashHost,
            "forbid-guest" => RuleKind::ForbidGuest,
            _ => return None,
        })
    }

    /// Whether the source range is made of host ids (otherwise guest ids).
    fn source_is_host(self) -> bool {
        matches!(self, RuleKind::Host | RuleKind::SquashHost)
    }
}

/// One parsed rule, as written: `source` is the first number after the type, `target` the
/// second (0 for `forbid-guest`, which has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rule {
    pub kind: RuleKind,
    pub source: u32,
    pub target: u32,
    pub count: u32,
}

/// Why a rule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// The part before the first `:` is not a rule type.
    #[error("unknown rule type '{0}'")]
    UnknownType(String),
    /// Wrong number of `:`-separated numbers after the type.
    #[error("a {} rule takes {expected} numbers after the type, found {found}", .kind.name())]
    FieldCount {
        kind: RuleKind,
        expected: usize,
        found: usize,
    },
    /// A field is not a decimal number in range.
    #[error("'{0}' is not an id or count")]
    BadNumber(String),
    /// A range runs past [`MAX_ID`] (or a squash target is above it).
    #[error("the {what} starting at {first} runs past {MAX_ID}")]
    Overflow { what: &'static str, first: u32 },
    /// The rule covers ids an earlier rule already translates in the same direction.
    #[error(
        "{direction} ids {first} to {last} are already covered by '{other}' (rules in the same \
         direction may not overlap)"
    )]
    Overlap {
        direction: &'static str,
        first: u32,
        last: u32,
        other: Rule,
    },
}

/// A rule of `--translate-uid` or `--translate-gid` refused: the flag, the rule, and why. The
/// message says all three and the expected form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: invalid rule '{rule}': {error}; expected {form}", form = EXPECTED_FORM)]
pub struct TranslateError {
    pub flag: &'static str,
    pub rule: String,
    pub error: RuleError,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            RuleKind::ForbidGuest => write!(f, "forbid-guest:{}:{}", self.source, self.count),
            k => write!(
                f,
                "{}:{}:{}:{}",
                k.name(),
                self.source,
                self.target,
                self.count
            ),
        }
    }
}

fn number(s: &str) -> Result<u32, RuleError> {
    // Plain decimal digits only: no sign, no spaces, no radix prefixes.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RuleError::BadNumber(s.to_string()));
    }
    s.parse().map_err(|_| RuleError::BadNumber(s.to_string()))
}

/// The last id of the `count` ids from `first`, when it is at most [`MAX_ID`].
fn last_of(first: u32, count: u32) -> Option<u32> {
    let last = (u64::from(first) + u64::from(count)).checked_sub(1)?;
    u32::try_from(last)
        .ok()
        .filter(|&l| l <= MAX_ID && count > 0)
}

impl FromStr for Rule {
    type Err = RuleError;

    /// Parses one rule and checks its ranges on their own (not against other rules).
    fn from_str(s: &str) -> Result<Rule, RuleError> {
        let fields: Vec<&str> = s.split(':').collect();
        let name = fields.first().copied().unwrap_or_default();
        let kind =
            RuleKind::from_name(name).ok_or_else(|| RuleError::UnknownType(name.to_string()))?;
        let expected = if kind == RuleKind::ForbidGuest { 2 } else { 3 };
        if fields.len() != expected + 1 {
            return Err(RuleError::FieldCount {
                kind,
                expected,
                found: fields.len() - 1,
            });
        }
        let source = number(fields[1])?;
        let (target, count) = if kind == RuleKind::ForbidGuest {
            (0, number(fields[2])?)
        } else {
            (number(fields[2])?, number(fields[3])?)
        };
        let rule = Rule {
            kind,
            source,
            target,
            count,
        };
        if count == 0 {
            // An empty range: it names no id and changes nothing (as in the reference, which
            // Incus relies on: it passes `forbid-guest:0:0`).
            return Ok(rule);
        }
        let (src_name, dst_name) = if kind.source_is_host() {
            ("host range", "guest range")
        } else {
            ("guest range", "host range")
        };
        if last_of(source, count).is_none() {
            return Err(RuleError::Overflow {
                what: src_name,
                first: source,
            });
        }
        let target_ok = match kind {
            RuleKind::Guest | RuleKind::Host | RuleKind::Map => last_of(target, count).is_some(),
            RuleKind::SquashGuest | RuleKind::SquashHost => target <= MAX_ID,
            RuleKind::ForbidGuest => true,
        };
        if !target_ok {
            return Err(RuleError::Overflow {
                what: match kind {
                    RuleKind::SquashGuest => "host id",
                    RuleKind::SquashHost => "guest id",
                    _ => dst_name,
                },
                first: target,
            });
        }
        Ok(rule)
    }
}

/// What a covered id becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// `base + (id - first)`.
    Shift(u32),
    /// Always this id.
    Squash(u32),
    /// Refused (guest → host only).
    Forbid,
}

/// A range of ids `first..=last` and what they become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    first: u32,
    last: u32,
    action: Action,
    rule: Rule,
}

/// Translating a guest id hit a `forbid-guest` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forbidden;

/// The translation of one kind of id (uids, or gids) in both directions. The default
/// translates nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdMap {
    /// Guest → host spans, sorted by `first`, disjoint.
    to_host: Vec<Span>,
    /// Host → guest spans, sorted by `first`, disjoint.
    to_guest: Vec<Span>,
}

/// Inserts `span` keeping `spans` sorted; refuses it when it overlaps one already there.
fn insert(spans: &mut Vec<Span>, span: Span, direction: &'static str) -> Result<(), RuleError> {
    let at = spans.partition_point(|s| s.last < span.first);
    if let Some(next) = spans.get(at) {
        if next.first <= span.last {
            return Err(RuleError::Overlap {
                direction,
                first: span.first.max(next.first),
                last: span.last.min(next.last),
                other: next.rule,
            });
        }
    }
    spans.insert(at, span);
    Ok(())
}

fn find(spans: &[Span], id: u32) -> Option<&Span> {
    let at = spans.partition_point(|s| s.last < id);
    spans.get(at).filter(|s| s.first <= id)
}

fn apply(span: &Span, id: u32) -> Result<u32, Forbidden> {
    match span.action {
        // In range by construction (both ranges were checked against MAX_ID); the fallback
        // only keeps this free of panics.
        Action::Shift(base) => Ok(base.checked_add(id - span.first).unwrap_or(id)),
        Action::Squash(to) => Ok(to),
        Action::Forbid => Err(Forbidden),
    }
}

impl IdMap {
    /// A map that translates nothing.
    pub fn new() -> IdMap {
        IdMap::default()
    }

    /// Builds the map from the rules of one flag (`flag` is its name, for messages), refusing
    /// a rule that overlaps an earlier one in the same direction.
    pub fn from_rules(flag: &'static str, rules: &[Rule]) -> Result<IdMap, TranslateError> {
        let mut map = IdMap::new();
        for &r in rules {
            map.add(r).map_err(|error| TranslateError {
                flag,
                rule: r.to_string(),
                error,
            })?;
        }
        Ok(map)
    }

    /// Parses the values of one flag (`flag` is its name, for messages), refusing a malformed
    /// rule or one that overlaps an earlier one in the same direction.
    pub fn parse<S: AsRef<str>>(flag: &'static str, specs: &[S]) -> Result<IdMap, TranslateError> {
        let mut map = IdMap::new();
        for spec in specs {
            let spec = spec.as_ref();
            spec.parse::<Rule>()
                .and_then(|r| map.add(r))
                .map_err(|error| TranslateError {
                    flag,
                    rule: spec.to_owned(),
                    error,
                })?;
        }
        Ok(map)
    }

    /// Adds one rule (already checked on its own by parsing, checked again here), refusing it
    /// when it overlaps a rule already added in the same direction. On error the map is
    /// unchanged.
    pub fn add(&mut self, r: Rule) -> Result<(), RuleError> {
        // Re-check the rule's own ranges: a `Rule` may have been built by hand.
        let checked: Rule = r.to_string().parse()?;
        if checked.count == 0 {
            // Covers no id.
            return Ok(());
        }
        let span = |first: u32, action: Action| Span {
            first,
            last: last_of(first, checked.count).unwrap_or(first),
            action,
            rule: checked,
        };
        let (s, t) = (checked.source, checked.target);
        let (to_host, to_guest) = match checked.kind {
            RuleKind::Guest => (Some(span(s, Action::Shift(t))), None),
            RuleKind::Host => (None, Some(span(s, Action::Shift(t)))),
            RuleKind::Map => (
                Some(span(s, Action::Shift(t))),
                Some(span(t, Action::Shift(s))),
            ),
            RuleKind::SquashGuest => (Some(span(s, Action::Squash(t))), None),
            RuleKind::SquashHost => (None, Some(span(s, Action::Squash(t)))),
            RuleKind::ForbidGuest => (Some(span(s, Action::Forbid)), None),
        };
        let mut new_to_host = self.to_host.clone();
        let mut new_to_guest = self.to_guest.clone();
        if let Some(sp) = to_host {
            insert(&mut new_to_host, sp, "guest")?;
        }
        if let Some(sp) = to_guest {
            insert(&mut new_to_guest, sp, "host")?;
        }
        self.to_host = new_to_host;
        self.to_guest = new_to_guest;
        Ok(())
    }

    /// Whether no rule was given.
    pub fn is_empty(&self) -> bool {
        self.to_host.is_empty() && self.to_guest.is_empty()
    }

    /// The host id for guest id `id`; [`Forbidden`] when a `forbid-guest` rule covers it.
    pub fn to_host(&self, id: u32) -> Result<u32, Forbidden> {
        match find(&self.to_host, id) {
            Some(span) => apply(span, id),
            None => Ok(id),
        }
    }

    /// The guest id for host id `id`.
    pub fn to_guest(&self, id: u32) -> u32 {
        match find(&self.to_guest, id) {
            Some(span) => apply(span, id).unwrap_or(id),
            None => id,
        }
    }
}

/// The uid and gid translations the daemon applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Translation {
    pub uid: IdMap,
    pub gid: IdMap,
}

impl Translation {
    /// The translation of the rules of `--translate-uid` and `--translate-gid`, each rule
    /// already parsed on its own.
    pub fn from_rules(
        uid_rules: &[Rule],
        gid_rules: &[Rule],
    ) -> Result<Translation, TranslateError> {
        Ok(Translation {
            uid: IdMap::from_rules("--translate-uid", uid_rules)?,
            gid: IdMap::from_rules("--translate-gid", gid_rules)?,
        })
    }

    /// Whether neither uids nor gids are translated.
    pub fn is_empty(&self) -> bool {
        self.uid.is_empty() && self.gid.is_empty()
    }
}

#[cfg(test)]
mod tests;
