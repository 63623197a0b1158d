//! `clients/go/types_gen.go`: Go 1.19, the standard library only, formatted by gofmt.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::schema::{Enum, Field, ITEMS, Item, Presence, Struct, Ty, Union, enum_named};
use super::{HEADER, is_zero_default, union_fields, upper_camel};

pub fn emit() -> Result<String> {
    let mut out = format!("// Code {HEADER}.\n\npackage liveness\n\n");
    out.push_str("import (\n\t\"encoding/json\"\n\t\"fmt\"\n)\n");
    for item in ITEMS {
        match item {
            Item::Enum(e) => emit_enum(&mut out, e),
            Item::Struct(s) if s.fields.iter().any(|f| f.presence == Presence::Nullable) => {
                emit_wire_struct(&mut out, s)
            }
            Item::Struct(s) => emit_struct(&mut out, s),
            Item::Union(u) => emit_union(&mut out, u),
        }
    }
    out.push_str(HELPERS);
    gofmt(&out)
}

/// Helpers of the structs whose Go fields differ from the wire's (null, defaults).
const HELPERS: &str = r#"
func orNil[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

func orZero[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func omitIf[T comparable](v, fallback T) *T {
	if v == fallback {
		return nil
	}
	return &v
}

func orDefault[T any](p *T, fallback T) T {
	if p == nil {
		return fallback
	}
	return *p
}

func nonNil[K comparable, V any](m map[K]V) map[K]V {
	if m == nil {
		return map[K]V{}
	}
	return m
}
"#;

fn gofmt(source: &str) -> Result<String> {
    let mut child = Command::new("gofmt")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running gofmt (install Go: apt-get install golang-go)")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(source.as_bytes())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!("gofmt refused the generated Go:\n{source}");
    }
    Ok(String::from_utf8(output.stdout)?)
}

fn comment(out: &mut String, indent: &str, doc: &str) {
    if !doc.is_empty() {
        let _ = writeln!(out, "{indent}// {doc}");
    }
}

/// `InvalidJson` → `InvalidJSON`.
fn variant_name(rust: &str) -> String {
    let mut snake = String::new();
    for (i, c) in rust.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.extend(c.to_lowercase());
    }
    upper_camel(&snake)
}

fn const_name(e: &Enum, rust: &str) -> String {
    format!("{}{}", e.go_prefix, variant_name(rust))
}

fn emit_enum(out: &mut String, e: &Enum) {
    let name = e.go_type();
    let _ = write!(
        out,
        "\n// {name} is {}\ntype {name} string\n\n",
        lower_first(e.doc)
    );
    let _ = writeln!(out, "// The values of {name}.\nconst (");
    for (rust, value, doc) in e.values {
        comment(out, "\t", doc);
        let _ = writeln!(out, "\t{} {name} = {value:?}", const_name(e, rust));
    }
    out.push_str(")\n\n");
    let list: Vec<String> = e.values.iter().map(|(r, _, _)| const_name(e, r)).collect();
    let _ = writeln!(
        out,
        "// {} lists every {name}, in the daemon's order.\nvar {} = []{name}{{{}}}",
        e.list,
        e.list,
        list.join(", ")
    );
    if !e.open {
        let _ = write!(
            out,
            "\n// UnmarshalJSON refuses a {name} this client does not know.\n\
             func (v *{name}) UnmarshalJSON(data []byte) error {{\n\tvar s string\n\
             \tif err := json.Unmarshal(data, &s); err != nil {{\n\t\treturn err\n\t}}\n\
             \tswitch {name}(s) {{\n\tcase {}:\n\t\t*v = {name}(s)\n\t\treturn nil\n\t}}\n\
             \treturn fmt.Errorf(\"liveness: unknown {name} %q\", s)\n}}\n",
            list.join(", ")
        );
    }
}

/// The Go type of a value of `ty`.
fn base(ty: Ty) -> String {
    match ty {
        Ty::Bool => "bool".into(),
        Ty::U8 => "uint8".into(),
        Ty::U32 => "uint32".into(),
        Ty::U64 => "uint64".into(),
        Ty::I64 => "int64".into(),
        Ty::Str => "string".into(),
        Ty::List(item) => format!("[]{}", base(*item)),
        Ty::Map(value) => format!("map[string]{}", base(*value)),
        Ty::Named(name) => enum_named(name).map_or(name, Enum::go_type).into(),
    }
}

/// Whether absence is written as a zero value (strings, enums, lists, maps) rather than a nil
/// pointer (numbers, booleans, structs).
fn zero_means_absent(ty: Ty) -> bool {
    match ty {
        Ty::Str | Ty::List(_) | Ty::Map(_) => true,
        Ty::Named(name) => enum_named(name).is_some(),
        _ => false,
    }
}

fn is_struct(ty: Ty) -> bool {
    matches!(ty, Ty::Named(name) if enum_named(name).is_none())
}

/// The Go type and tag options of a field written as the wire has it.
fn wire_field(f: &Field) -> (String, &'static str) {
    match f.presence {
        Presence::Required => (base(f.ty), ""),
        Presence::Nullable => (format!("*{}", base(f.ty)), ""),
        Presence::Optional if zero_means_absent(f.ty) => (base(f.ty), ",omitempty"),
        Presence::Optional => (format!("*{}", base(f.ty)), ",omitempty"),
        Presence::Default { omit: false, .. } => (base(f.ty), ""),
        Presence::Default { value, omit: true } if is_zero_default(value) => {
            (base(f.ty), ",omitempty")
        }
        Presence::Default { omit: true, .. } => (format!("*{}", base(f.ty)), ",omitempty"),
    }
}

fn emit_struct(out: &mut String, s: &Struct) {
    let _ = write!(
        out,
        "\n// {} is {}\ntype {} struct {{\n",
        s.name,
        lower_first(s.doc),
        s.name
    );
    tagged_fields(out, s.fields, true);
}

/// A struct's fields as the wire has them, with their tags, and its closing brace.
fn tagged_fields(out: &mut String, fields: &[Field], docs: bool) {
    for f in fields {
        if docs {
            comment(out, "\t", f.doc);
        }
        let (ty, options) = wire_field(f);
        let _ = writeln!(
            out,
            "\t{} {ty} `json:\"{}{options}\"`",
            upper_camel(f.name),
            f.name
        );
    }
    out.push_str("}\n");
}

/// A default as a Go expression of the field's type.
fn go_default(f: &Field, value: &str) -> String {
    match f.ty {
        Ty::Named(name) => {
            let e = enum_named(name).expect("only enums have defaults among named types");
            let wire: String = serde_json::from_str(value).expect("an enum's default is a string");
            let (rust, _, _) = e
                .values
                .iter()
                .find(|(_, v, _)| *v == wire)
                .expect("the default is a value of the enum");
            const_name(e, rust)
        }
        _ => value.to_owned(),
    }
}

/// A struct with fields written as null: its Go fields hold zero values instead, and a
/// twin with the wire's pointers marshals it.
fn emit_wire_struct(out: &mut String, s: &Struct) {
    let name = s.name;
    let twin = format!("{}JSON", super::lower_camel(name));
    let _ = write!(
        out,
        "\n// {name} is {}\ntype {name} struct {{\n",
        lower_first(s.doc)
    );
    for f in s.fields {
        comment(out, "\t", f.doc);
        let ty = match f.presence {
            Presence::Nullable | Presence::Optional if is_struct(f.ty) => {
                format!("*{}", base(f.ty))
            }
            _ => base(f.ty),
        };
        let _ = writeln!(out, "\t{} {ty}", upper_camel(f.name));
    }
    out.push_str("}\n");
    let _ = write!(
        out,
        "\n// {twin} is {name} as the wire has it.\ntype {twin} struct {{\n"
    );
    tagged_fields(out, s.fields, false);

    let mut to_wire = String::new();
    let mut from_wire = String::new();
    let mut defaults = Vec::new();
    for f in s.fields {
        let field = upper_camel(f.name);
        let (wire_ty, _) = wire_field(f);
        let pointer_on_wire = wire_ty.starts_with('*') && !is_struct(f.ty);
        let (to, from) = match f.presence {
            Presence::Required if matches!(f.ty, Ty::Map(_)) => {
                (format!("nonNil(s.{field})"), format!("w.{field}"))
            }
            Presence::Default { value, omit: true } if pointer_on_wire => {
                let fallback = go_default(f, value);
                (
                    format!("omitIf(s.{field}, {fallback})"),
                    format!("orDefault(w.{field}, {fallback})"),
                )
            }
            Presence::Default { value, omit: false } if !is_zero_default(value) => {
                defaults.push(format!("{field}: {}", go_default(f, value)));
                (format!("s.{field}"), format!("w.{field}"))
            }
            _ if pointer_on_wire => (format!("orNil(s.{field})"), format!("orZero(w.{field})")),
            _ => (format!("s.{field}"), format!("w.{field}")),
        };
        let _ = writeln!(to_wire, "\t\t{field}: {to},");
        let _ = writeln!(from_wire, "\t\t{field}: {from},");
    }
    let _ = write!(
        out,
        "\n// MarshalJSON writes null for what does not apply, as the daemon does.\n\
         func (s {name}) MarshalJSON() ([]byte, error) {{\n\treturn json.Marshal({twin}{{\n{to_wire}\t}})\n}}\n"
    );
    let _ = write!(
        out,
        "\n// UnmarshalJSON reads a {name}; what is absent gets the daemon's default.\n\
         func (s *{name}) UnmarshalJSON(data []byte) error {{\n\tw := {twin}{{{}}}\n\
         \tif err := json.Unmarshal(data, &w); err != nil {{\n\t\treturn err\n\t}}\n\
         \t*s = {name}{{\n{from_wire}\t}}\n\treturn nil\n}}\n",
        defaults.join(", ")
    );
}

/// A sentence's first letter in lower case, to follow "X is", unless it starts a name
/// (`CLOCK_MONOTONIC`).
fn lower_first(doc: &str) -> String {
    let mut chars = doc.chars();
    match (chars.next(), chars.next()) {
        (Some(first), Some(second)) if second.is_lowercase() || second == ' ' || second == '\'' => {
            first.to_lowercase().chain([second]).chain(chars).collect()
        }
        _ => doc.to_owned(),
    }
}

/// A union as one struct of every kind's fields; it marshals only those of its kind.
fn emit_union(out: &mut String, u: &Union) {
    let name = u.name;
    let kinds = enum_named(u.kinds).expect("a union's kinds are an enum");
    let kind_ty = kinds.go_type();
    let fields = union_fields(u);
    let _ = write!(
        out,
        "\n// {name} is {} Kind says which of the fields apply; it marshals only those.\n\
         type {name} struct {{\n\tKind {kind_ty}\n",
        lower_first(u.doc)
    );
    for f in &fields {
        comment(out, "\t", f.doc);
        let _ = writeln!(out, "\t{} {}", upper_camel(f.name), union_type(f));
    }
    out.push_str("}\n");

    let _ = write!(
        out,
        "\n// MarshalJSON writes only the fields of the {name}'s kind.\n\
         func (v {name}) MarshalJSON() ([]byte, error) {{\n\tswitch v.Kind {{\n"
    );
    for variant in u.variants {
        let (rust, _, _) = kinds
            .values
            .iter()
            .find(|(_, value, _)| *value == variant.kind)
            .expect("a union's kind is a value of its enum");
        let _ = write!(
            out,
            "\tcase {}:\n\t\treturn json.Marshal(struct {{\n\t\t\tKind {kind_ty} `json:\"kind\"`\n",
            const_name(kinds, rust)
        );
        let mut values = vec!["v.Kind".to_owned()];
        for f in variant.fields {
            let options = if f.presence == Presence::Required {
                ""
            } else {
                ",omitempty"
            };
            let _ = writeln!(
                out,
                "\t\t\t{} {} `json:\"{}{options}\"`",
                upper_camel(f.name),
                union_type(f),
                f.name
            );
            values.push(format!("v.{}", upper_camel(f.name)));
        }
        let _ = writeln!(out, "\t\t}}{{{}}})", values.join(", "));
    }
    out.push_str("\t}\n");
    if kinds.open {
        let _ = writeln!(
            out,
            "\treturn json.Marshal(struct {{\n\t\tKind {kind_ty} `json:\"kind\"`\n\t}}{{v.Kind}})\n}}"
        );
    } else {
        let _ = writeln!(
            out,
            "\treturn nil, fmt.Errorf(\"liveness: %s of unknown kind %q\", \"{name}\", v.Kind)\n}}"
        );
    }

    let _ = write!(
        out,
        "\n// UnmarshalJSON reads a {name}{}.\nfunc (v *{name}) UnmarshalJSON(data []byte) error {{\n\
         \tvar raw struct {{\n\t\tKind {kind_ty} `json:\"kind\"`\n",
        if kinds.open {
            "; a kind this client does not know keeps its name"
        } else {
            " and refuses kinds it does not know"
        }
    );
    for f in &fields {
        let _ = writeln!(
            out,
            "\t\t{} {} `json:\"{}\"`",
            upper_camel(f.name),
            union_type(f),
            f.name
        );
    }
    out.push_str(
        "\t}\n\tif err := json.Unmarshal(data, &raw); err != nil {\n\t\treturn err\n\t}\n",
    );
    if !kinds.open {
        let consts: Vec<String> = kinds
            .values
            .iter()
            .map(|(r, _, _)| const_name(kinds, r))
            .collect();
        let _ = write!(
            out,
            "\tswitch raw.Kind {{\n\tcase {}:\n\tdefault:\n\t\treturn fmt.Errorf(\"liveness: %s of unknown kind %q\", \"{name}\", raw.Kind)\n\t}}\n",
            consts.join(", ")
        );
    }
    let _ = writeln!(out, "\t*v = {name}(raw)\n\treturn nil\n}}");
}

/// A union's field: its value where its kind requires it, else as an optional field.
fn union_type(f: &Field) -> String {
    if f.presence == Presence::Required || zero_means_absent(f.ty) {
        base(f.ty)
    } else {
        format!("*{}", base(f.ty))
    }
}
