//! Holds [`super::schema`] against the serde types it describes. For each struct and each
//! variant of a union: the fields serde writes or skips (traced from a value, so a new
//! `Option` field skipped when `None` counts too) are the schema's, in its order; a value
//! with every field set reads and writes back unchanged (the types agree); a value with
//! only the required fields writes back what the schema says of the others (null, left
//! out, or their default); each required field is required; `strict` types refuse unknown
//! fields and the others do not. For each enum: each value reads and writes back, and the
//! values serde names for an unknown one are the schema's, in its order.

use serde_json::{Map, Value, json};

use super::probe::Probe;
use super::schema::{Enum, Field, ITEMS, Item, Presence, Struct, Ty, Union};

/// Every disagreement between the schema and the serde types.
pub fn problems() -> Vec<String> {
    let mut problems = Vec::new();
    for item in ITEMS {
        match item {
            Item::Enum(e) => check_enum(e, &mut problems),
            Item::Struct(s) => check_struct(s, &mut problems),
            Item::Union(u) => check_union(u, &mut problems),
        }
    }
    problems
}

fn check_enum(e: &Enum, problems: &mut Vec<String>) {
    let Some(probe) = e.probe else {
        return;
    };
    for (_, value, _) in e.values {
        match (probe.0)(&json!(value)) {
            Ok(probed) if probed.json == json!(value) => {}
            Ok(probed) => problems.push(format!(
                "{}: {value:?} is written back as {}",
                e.name, probed.json
            )),
            Err(error) => problems.push(format!("{}: {value:?} is refused: {error}", e.name)),
        }
    }
    let wire: Vec<&str> = e.values.iter().map(|(_, value, _)| *value).collect();
    compare_variants(e.name, &wire, probe, json!("\u{1}"), problems);
}

/// The values serde names when it refuses an unknown one must be `known`.
fn compare_variants(
    name: &str,
    known: &[&str],
    probe: Probe,
    unknown: Value,
    problems: &mut Vec<String>,
) {
    match (probe.0)(&unknown).map(|_| ()) {
        Ok(()) => problems.push(format!("{name}: an unknown value is accepted")),
        Err(error) => {
            let named = expected_variants(&error);
            if named != known {
                problems.push(format!(
                    "{name}: serde knows {named:?}, the schema {known:?}: describe the change in \
                     xtask/src/gen_clients/schema.rs"
                ));
            }
        }
    }
}

/// The variants in serde's "unknown variant `x`, expected one of `a`, `b`" (or "expected
/// `a` or `b`", or "expected `a`").
fn expected_variants(error: &str) -> Vec<String> {
    let Some((_, expected)) = error.split_once("expected ") else {
        return Vec::new();
    };
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn check_union(u: &Union, problems: &mut Vec<String>) {
    let kinds: Vec<&str> = u.variants.iter().map(|v| v.kind).collect();
    match super::schema::enum_named(u.kinds) {
        Some(e)
            if e.values
                .iter()
                .map(|(_, value, _)| *value)
                .eq(kinds.iter().copied()) => {}
        _ => problems.push(format!(
            "{}: its kinds {kinds:?} are not those of the enum {}",
            u.name, u.kinds
        )),
    }
    compare_variants(u.name, &kinds, u.probe, json!({"kind": "\u{1}"}), problems);
    for variant in u.variants {
        let name = format!("{} {:?}", u.name, variant.kind);
        check_fields(&name, u.probe, variant.fields, Some(variant.kind), problems);
    }
}

fn check_struct(s: &Struct, problems: &mut Vec<String>) {
    check_fields(s.name, s.probe, s.fields, None, problems);
    let mut unknown = full_sample(s.fields, None);
    unknown["zz_unknown"] = json!(1);
    match ((s.probe.0)(&unknown).is_ok(), s.strict) {
        (true, true) => problems.push(format!("{}: unknown fields are accepted", s.name)),
        (false, false) => problems.push(format!("{}: unknown fields are refused", s.name)),
        _ => {}
    }
}

fn check_fields(
    name: &str,
    probe: Probe,
    fields: &[Field],
    kind: Option<&str>,
    problems: &mut Vec<String>,
) {
    let full = full_sample(fields, kind);
    match (probe.0)(&full) {
        Err(error) => problems.push(format!(
            "{name}: a value with every field is refused: {error}"
        )),
        Ok(probed) => {
            let described: Vec<&str> = kind
                .map(|_| "kind")
                .into_iter()
                .chain(fields.iter().map(|f| f.name))
                .collect();
            if probed.fields != described {
                problems.push(format!(
                    "{name}: serde has the fields {:?}, the schema {described:?}: describe the \
                     change in xtask/src/gen_clients/schema.rs",
                    probed.fields
                ));
            } else if probed.json != full {
                problems.push(format!(
                    "{name}: {full} is written back as {}: a type differs",
                    probed.json
                ));
            }
        }
    }
    let minimal = tagged(kind, |object| {
        for f in fields.iter().filter(|f| f.presence == Presence::Required) {
            object.insert(f.name.into(), sample(f.ty));
        }
    });
    let expected = tagged(kind, |object| {
        for f in fields {
            let value = match f.presence {
                Presence::Required => sample(f.ty),
                Presence::Nullable => Value::Null,
                Presence::Optional | Presence::Default { omit: true, .. } => continue,
                Presence::Default { value, omit: false } => {
                    serde_json::from_str(value).expect("a default is JSON")
                }
            };
            object.insert(f.name.into(), value);
        }
    });
    match (probe.0)(&minimal) {
        Err(error) => problems.push(format!(
            "{name}: a value with only the required fields is refused: {error}"
        )),
        Ok(probed) if probed.json != expected => problems.push(format!(
            "{name}: {minimal} is written back as {}, the schema says {expected}: a field's \
             presence or default differs",
            probed.json
        )),
        Ok(_) => {}
    }
    for f in fields.iter().filter(|f| f.presence == Presence::Required) {
        let mut without = minimal.clone();
        without.as_object_mut().expect("an object").remove(f.name);
        if (probe.0)(&without).is_ok() {
            problems.push(format!("{name}: {} is not required", f.name));
        }
    }
}

fn tagged(kind: Option<&str>, fill: impl FnOnce(&mut Map<String, Value>)) -> Value {
    let mut object = Map::new();
    if let Some(kind) = kind {
        object.insert("kind".into(), json!(kind));
    }
    fill(&mut object);
    Value::Object(object)
}

fn full_sample(fields: &[Field], kind: Option<&str>) -> Value {
    tagged(kind, |object| {
        for f in fields {
            object.insert(f.name.into(), sample(f.ty));
        }
    })
}

/// A value of `ty` unlike every default: true, 7, "x", the last value of an enum.
pub fn sample(ty: Ty) -> Value {
    match ty {
        Ty::Bool => json!(true),
        Ty::U8 | Ty::U32 | Ty::U64 | Ty::I64 => json!(7),
        Ty::Str => json!("x"),
        Ty::List(item) => json!([sample(*item)]),
        Ty::Map(value) => json!({ "k": sample(*value) }),
        Ty::Named(name) => ITEMS
            .iter()
            .find_map(|item| match item {
                Item::Enum(e) if e.name == name => {
                    Some(json!(e.values.last().expect("an enum has values").1))
                }
                Item::Struct(s) if s.name == name => Some(full_sample(s.fields, None)),
                Item::Union(u) if u.name == name => {
                    let first = &u.variants[0];
                    Some(full_sample(first.fields, Some(first.kind)))
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("the schema names {name} but does not describe it")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen_clients::probe::probe;

    /// The guard of the generated clients: a field or a value added to, renamed in or
    /// removed from a wire type of liveness-common, and not described, fails here.
    #[test]
    fn the_schema_describes_the_serde_types_exactly() {
        let problems = problems();
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Grown {
        a: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        b: Option<u32>,
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Wider {
        One,
        Two,
    }

    /// A field skipped when empty and a value added are both seen, though no sample
    /// shows them.
    #[test]
    fn what_serde_has_beyond_the_schema_is_a_problem() {
        let grown = Struct {
            name: "Grown",
            doc: "",
            strict: false,
            probe: Probe(probe::<Grown>),
            fields: &[Field {
                name: "a",
                ty: Ty::U32,
                presence: Presence::Required,
                doc: "",
            }],
        };
        let mut problems = Vec::new();
        check_struct(&grown, &mut problems);
        assert!(
            matches!(&problems[..], [one] if one.contains(r#"["a", "b"]"#)),
            "{problems:?}"
        );
        let wider = Enum {
            name: "Wider",
            doc: "",
            go_name: "",
            go_prefix: "",
            list: "Widers",
            open: false,
            consts: false,
            values: &[("One", "one", "")],
            probe: Some(Probe(probe::<Wider>)),
        };
        let mut problems = Vec::new();
        check_enum(&wider, &mut problems);
        assert!(
            matches!(&problems[..], [one] if one.contains(r#"["one", "two"]"#)),
            "{problems:?}"
        );
    }

    #[test]
    fn serde_names_the_known_variants_in_three_spellings() {
        for (error, expected) in [
            (
                "unknown variant `z`, expected one of `a`, `b`, `c`",
                &["a", "b", "c"][..],
            ),
            ("unknown variant `z`, expected `a` or `b`", &["a", "b"]),
            ("unknown variant `z`, expected `a`", &["a"]),
        ] {
            assert_eq!(expected_variants(error), expected, "{error}");
        }
    }
}
