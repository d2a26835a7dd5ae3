//! `--xattrmap`: rules that rename, pass, refuse or hide extended attribute names between the
//! guest and the host.
//!
//! # Language
//! A map is a sequence of rules, separated by optional white space (new lines included). The
//! first character of a rule is its delimiter, used for that whole rule; each field ends with
//! it:
//!
//! - `DtypeDscopeDkeyDprependD` with `type` one of `prefix`, `ok`, `bad`, `unsupported` and
//!   `scope` one of `client`, `server`, `all`;
//! - `DmapDkeyDprependD`, a shorthand that must be the last rule (see [`XattrMap::parse`]).
//!
//! # Matching
//! A name coming from the guest (GETXATTR, SETXATTR, REMOVEXATTR, and the security context of
//! a creation) is matched against the `key` of the rules whose scope is `client` or `all`; a
//! name the host lists (LISTXATTR) against the `prepend` of those whose scope is `server` or
//! `all`. A field matches every name it is a prefix of (the empty field matches everything);
//! the first rule that matches decides:
//!
//! | type          | guest name                         | host name                           |
//! |---------------|------------------------------------|-------------------------------------|
//! | `prefix`      | `prepend` + name goes to the host  | shown without `prepend`             |
//! | `ok`          | goes to the host unchanged         | shown unchanged                     |
//! | `bad`         | refused (`EPERM`; GETXATTR: `ENODATA`) | hidden                          |
//! | `unsupported` | refused (`EOPNOTSUPP`)             | hidden                              |
//!
//! A name no rule matches is treated as by a final `bad` rule in both directions: refused going
//! to the host, hidden coming back. A map should end with a catch-all rule (`:ok:all:::` or
//! `:bad:all:::`) to say which it means.

use std::borrow::Cow;
use std::ffi::{CStr, CString};
use std::str::FromStr;

/// What a rule does with a name it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Prefix,
    Ok,
    Bad,
    Unsupported,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    kind: Kind,
    /// Applies to names from the guest.
    client: bool,
    /// Applies to names the host lists.
    server: bool,
    key: Vec<u8>,
    prepend: Vec<u8>,
}

impl Rule {
    fn new(kind: Kind, client: bool, server: bool, key: &[u8], prepend: &[u8]) -> Rule {
        Rule {
            kind,
            client,
            server,
            key: key.to_vec(),
            prepend: prepend.to_vec(),
        }
    }
}

/// The verdict on a name from the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToHost<'a> {
    /// Use this host name.
    Name(Cow<'a, CStr>),
    /// A `bad` rule (or no rule) matched.
    Denied,
    /// An `unsupported` rule matched.
    Unsupported,
}

/// A parsed `--xattrmap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrMap {
    rules: Vec<Rule>,
}

/// The expected form, for error messages.
const FORM: &str = "expected rules of the form :type:scope:key:prepend: (type prefix, ok, bad or \
                    unsupported; scope client, server or all) or a final :map:key:prepend:";

/// Why rules were refused; `rule` counts from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XattrMapError {
    #[error("rule {rule}: a map rule must be the last rule; {}", FORM)]
    MapNotLast { rule: usize },
    #[error("rule {rule}: the delimiter must be an ASCII character; {}", FORM)]
    NonAsciiDelimiter { rule: usize },
    #[error(
        "rule {rule}: incomplete, the {field} field does not end with '{delim}'; {}",
        FORM
    )]
    Incomplete {
        rule: usize,
        field: &'static str,
        delim: char,
    },
    #[error("rule {rule}: the {field} field contains a NUL byte")]
    Nul { rule: usize, field: &'static str },
    #[error("rule {rule}: unknown type '{name}'; expected prefix, ok, bad, unsupported or map")]
    UnknownType { rule: usize, name: String },
    #[error("rule {rule}: unknown scope '{name}'; expected client, server or all")]
    UnknownScope { rule: usize, name: String },
    #[error("no rules given; {}", FORM)]
    NoRules,
}

impl XattrMap {
    /// Parses the rules of `--xattrmap`. The error says what is wrong and in which rule
    /// (counting from 1).
    ///
    /// `:map:key:prepend:` stands for three rules (two when `key` is empty):
    /// `:prefix:all:key:prepend:`, then, with a non-empty `key`, `:bad:all:prepend:key:` (the
    /// guest may not reach the host names directly, and unprefixed host names under `key` are
    /// hidden) and a final `:ok:all:::`; with an empty `key` a final `:bad:all:::` instead.
    pub fn parse(input: &str) -> Result<XattrMap, XattrMapError> {
        let bytes = input.as_bytes();
        let mut rules = Vec::new();
        let mut pos = 0;
        let mut number = 0;
        let mut map_seen = false;
        loop {
            while pos < bytes.len() && bytes[pos].is_ascii_whitespace() {
                pos += 1;
            }
            if pos == bytes.len() {
                break;
            }
            number += 1;
            if map_seen {
                return Err(XattrMapError::MapNotLast { rule: number });
            }
            let delim = bytes[pos];
            if !delim.is_ascii() {
                return Err(XattrMapError::NonAsciiDelimiter { rule: number });
            }
            pos += 1;
            let mut field = |what: &'static str| -> Result<&[u8], XattrMapError> {
                let rest = &bytes[pos..];
                let end =
                    rest.iter()
                        .position(|&b| b == delim)
                        .ok_or(XattrMapError::Incomplete {
                            rule: number,
                            field: what,
                            delim: char::from(delim),
                        })?;
                let f = &rest[..end];
                if f.contains(&0) {
                    return Err(XattrMapError::Nul {
                        rule: number,
                        field: what,
                    });
                }
                pos += end + 1;
                Ok(f)
            };
            let kind = field("type")?;
            if kind == b"map" {
                let key = field("key")?;
                let prepend = field("prepend")?;
                rules.push(Rule::new(Kind::Prefix, true, true, key, prepend));
                if key.is_empty() {
                    rules.push(Rule::new(Kind::Bad, true, true, b"", b""));
                } else {
                    rules.push(Rule::new(Kind::Bad, true, true, prepend, key));
                    rules.push(Rule::new(Kind::Ok, true, true, b"", b""));
                }
                map_seen = true;
                continue;
            }
            let kind = match kind {
                b"prefix" => Kind::Prefix,
                b"ok" => Kind::Ok,
                b"bad" => Kind::Bad,
                b"unsupported" => Kind::Unsupported,
                other => {
                    return Err(XattrMapError::UnknownType {
                        rule: number,
                        name: String::from_utf8_lossy(other).into_owned(),
                    })
                }
            };
            let (client, server) = match field("scope")? {
                b"client" => (true, false),
                b"server" => (false, true),
                b"all" => (true, true),
                other => {
                    return Err(XattrMapError::UnknownScope {
                        rule: number,
                        name: String::from_utf8_lossy(other).into_owned(),
                    })
                }
            };
            let key = field("key")?;
            let prepend = field("prepend")?;
            rules.push(Rule::new(kind, client, server, key, prepend));
        }
        if rules.is_empty() {
            return Err(XattrMapError::NoRules);
        }
        Ok(XattrMap { rules })
    }

    /// The host name for `name` from the guest.
    pub fn to_host<'a>(&self, name: &'a CStr) -> ToHost<'a> {
        let n = name.to_bytes();
        let rule = self
            .rules
            .iter()
            .find(|r| r.client && n.starts_with(&r.key));
        match rule.map(|r| (r.kind, r)) {
            Some((Kind::Ok, _)) => ToHost::Name(Cow::Borrowed(name)),
            Some((Kind::Prefix, r)) => {
                let mut host = r.prepend.clone();
                host.extend_from_slice(n);
                // Neither part contains a NUL: the name is a C string, the prefix was checked.
                match CString::new(host) {
                    Ok(c) => ToHost::Name(Cow::Owned(c)),
                    Err(_) => ToHost::Denied,
                }
            }
            Some((Kind::Unsupported, _)) => ToHost::Unsupported,
            Some((Kind::Bad, _)) | None => ToHost::Denied,
        }
    }

    /// The guest name for `name` as the host lists it; `None` when it is hidden.
    pub fn to_guest<'a>(&self, name: &'a [u8]) -> Option<&'a [u8]> {
        let r = self
            .rules
            .iter()
            .find(|r| r.server && name.starts_with(&r.prepend))?;
        match r.kind {
            Kind::Ok => Some(name),
            Kind::Prefix => {
                let stripped = &name[r.prepend.len()..];
                // A host name that is exactly the prefix has no guest name.
                (!stripped.is_empty()).then_some(stripped)
            }
            Kind::Bad | Kind::Unsupported => None,
        }
    }
}

impl FromStr for XattrMap {
    type Err = XattrMapError;

    /// As [`XattrMap::parse`].
    fn from_str(s: &str) -> Result<XattrMap, XattrMapError> {
        XattrMap::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(s: &str) -> XattrMap {
        XattrMap::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn host(m: &XattrMap, name: &str) -> Result<String, &'static str> {
        let c = CString::new(name).unwrap();
        match m.to_host(&c) {
            ToHost::Name(n) => Ok(n.to_str().unwrap().to_owned()),
            ToHost::Denied => Err("EPERM"),
            ToHost::Unsupported => Err("ENOTSUP"),
        }
    }

    fn guest(m: &XattrMap, name: &str) -> Option<String> {
        m.to_guest(name.as_bytes())
            .map(|g| String::from_utf8(g.to_vec()).unwrap())
    }

    #[test]
    fn one_prefix_rule_for_client_names_only() {
        let m = map(":prefix:client:trusted.:user.virtiofs.:");
        assert_eq!(host(&m, "trusted.x").unwrap(), "user.virtiofs.trusted.x");
        // Nothing else matches: the implicit final rule refuses and hides.
        assert_eq!(host(&m, "user.x"), Err("EPERM"));
        assert_eq!(guest(&m, "user.virtiofs.trusted.x"), None);
    }

    #[test]
    fn a_server_prefix_rule_strips_from_listed_names() {
        let m = map(":prefix:server::user.virtiofs.: :ok:all:::");
        assert_eq!(guest(&m, "user.virtiofs.security.x").unwrap(), "security.x");
        assert_eq!(guest(&m, "user.other").unwrap(), "user.other");
        // Client names are not prefixed by a server-only rule.
        assert_eq!(host(&m, "user.other").unwrap(), "user.other");
        // The bare prefix has no guest name.
        assert_eq!(guest(&m, "user.virtiofs."), None);
    }

    #[test]
    fn everything_prefixed_and_the_rest_hidden() {
        // Two explicit rules, and the same as a map rule.
        for s in [
            ":prefix:all::user.virtiofs.::bad:all:::",
            ":map::user.virtiofs.:",
        ] {
            let m = map(s);
            assert_eq!(host(&m, "user.a").unwrap(), "user.virtiofs.user.a", "{s}");
            assert_eq!(
                host(&m, "security.selinux").unwrap(),
                "user.virtiofs.security.selinux"
            );
            assert_eq!(guest(&m, "user.virtiofs.user.a").unwrap(), "user.a");
            assert_eq!(
                guest(&m, "user.a"),
                None,
                "{s}: unprefixed host names are hidden"
            );
            assert_eq!(guest(&m, "security.selinux"), None);
        }
    }

    #[test]
    fn trusted_prefixed_others_passed_four_rules_and_map_agree() {
        let four = "/prefix/all/trusted./user.virtiofs./\n  /bad/server//trusted./\n\t\
                    /bad/client/user.virtiofs.//\n  /ok/all///";
        for s in [four, "/map/trusted./user.virtiofs./"] {
            let m = map(s);
            assert_eq!(
                host(&m, "trusted.overlay").unwrap(),
                "user.virtiofs.trusted.overlay"
            );
            assert_eq!(host(&m, "user.plain").unwrap(), "user.plain", "{s}");
            // The guest may not reach the target of the remapping directly.
            assert_eq!(host(&m, "user.virtiofs.trusted.x"), Err("EPERM"), "{s}");
            assert_eq!(guest(&m, "user.virtiofs.trusted.x").unwrap(), "trusted.x");
            // Unprefixed trusted. names on the host are hidden.
            assert_eq!(guest(&m, "trusted.host"), None, "{s}");
            assert_eq!(guest(&m, "user.plain").unwrap(), "user.plain");
            assert_eq!(guest(&m, "security.x").unwrap(), "security.x");
        }
    }

    #[test]
    fn security_hidden_and_refused_everything_else_passed() {
        let m = map("/bad/all/security./security./ /ok/all///");
        assert_eq!(host(&m, "security.selinux"), Err("EPERM"));
        assert_eq!(guest(&m, "security.selinux"), None);
        assert_eq!(host(&m, "user.a").unwrap(), "user.a");
        assert_eq!(guest(&m, "trusted.a").unwrap(), "trusted.a");
    }

    #[test]
    fn unsupported_refuses_with_enotsup_and_hides() {
        let m = map("/unsupported/all/security.selinux/security.selinux//ok/all///");
        assert_eq!(host(&m, "security.selinux"), Err("ENOTSUP"));
        assert_eq!(guest(&m, "security.selinux"), None);
        assert_eq!(host(&m, "security.ima").unwrap(), "security.ima");
    }

    #[test]
    fn the_first_matching_rule_wins() {
        let m = map(":ok:client:user.keep::  :prefix:all:user.:host.:  :bad:all:::");
        assert_eq!(host(&m, "user.keep.me").unwrap(), "user.keep.me");
        assert_eq!(host(&m, "user.other").unwrap(), "host.user.other");
        let m = map(":bad:all:::  :ok:all:::");
        assert_eq!(host(&m, "user.a"), Err("EPERM"));
    }

    #[test]
    fn any_ascii_delimiter_per_rule() {
        let m = map("|prefix|client|a.|b.| #ok#all###");
        assert_eq!(host(&m, "a.x").unwrap(), "b.a.x");
        assert_eq!(host(&m, "c").unwrap(), "c");
    }

    #[test]
    fn malformed_rules_are_refused_with_the_rule_number() {
        for (s, says) in [
            ("", "no rules"),
            ("   \n ", "no rules"),
            (":prefix:all:trusted.:user.vm.", "rule 1: incomplete"),
            (":ok:all:::  :prefix:all", "rule 2: incomplete"),
            (":frob:all:::", "rule 1: unknown type 'frob'"),
            (":ok:everyone:::", "rule 1: unknown scope 'everyone'"),
            (
                ":map::user.virtiofs.: :ok:all:::",
                "rule 2: a map rule must be the last",
            ),
            (":map:a.:b.::map:c.:d.:", "must be the last"),
            ("ämap:a:b:", "ASCII"),
            (":ok", "rule 1: incomplete"),
        ] {
            let e = XattrMap::parse(s).unwrap_err().to_string();
            assert!(e.contains(says), "{s:?}: {e}");
        }
    }

    #[test]
    fn a_map_rule_alone_after_other_rules_is_fine() {
        let m = map(":bad:client:user.secret.:: :map::user.vm.:");
        assert_eq!(host(&m, "user.secret.x"), Err("EPERM"));
        assert_eq!(host(&m, "user.a").unwrap(), "user.vm.user.a");
    }
}
