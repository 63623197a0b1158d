//! `clients/python/src/liveness/types_gen.py`: frozen dataclasses read and written by
//! `_codec.py`, `Literal` types for closed enums.

use std::fmt::Write as _;

use super::schema::{Enum, Field, ITEMS, Item, Presence, Struct, Ty, Union, enum_named};
use super::{HEADER, union_fields, upper_snake};

/// The classes whose hand-written methods (`_methods.py`) come first among their bases.
const WITH_METHODS: &[&str] = &["Identity", "ExitStatus", "ActionOutcome", "Session"];

pub fn emit() -> String {
    let mut out = format!(
        "# {HEADER}.\n\"\"\"The protocol's objects (docs/protocol.md §2, §5, §12, §14), as dataclasses.\"\"\"\n\n\
         from __future__ import annotations\n\n\
         from dataclasses import dataclass, field\n\
         from typing import Any, ClassVar, Dict, List, Literal, Optional, Tuple\n\n\
         from . import _methods\n\
         from ._codec import Tagged, Wire\n"
    );
    for item in ITEMS {
        match item {
            Item::Enum(e) => emit_enum(&mut out, e),
            Item::Struct(s) => emit_struct(&mut out, s),
            Item::Union(u) => emit_union(&mut out, u),
        }
    }
    out
}

fn emit_enum(out: &mut String, e: &Enum) {
    let values: Vec<String> = e.values.iter().map(|(_, v, _)| format!("{v:?}")).collect();
    let _ = write!(
        out,
        "\n{}: Tuple[str, ...] = ({},)\n\"\"\"Every {}, in the daemon's order.\"\"\"\n",
        upper_snake(e.list),
        values.join(", "),
        e.name
    );
    if e.open {
        let _ = writeln!(
            out,
            "{} = str\n\"\"\"{} A newer daemon may send other values.\"\"\"",
            e.name, e.doc
        );
    } else {
        let _ = writeln!(
            out,
            "{} = Literal[{}]\n\"\"\"{}\"\"\"",
            e.name,
            values.join(", "),
            e.doc
        );
    }
    if e.consts {
        for (_, value, text) in e.values {
            let _ = writeln!(
                out,
                "{} = {value:?}",
                value.replace('.', "_").to_uppercase()
            );
            if !text.is_empty() {
                let _ = writeln!(out, "\"\"\"{text}\"\"\"");
            }
        }
    }
}

fn py_type(ty: Ty) -> String {
    match ty {
        Ty::Bool => "bool".into(),
        Ty::U8 | Ty::U32 | Ty::U64 | Ty::I64 => "int".into(),
        Ty::Str => "str".into(),
        Ty::List(item) => format!("List[{}]", py_type(*item)),
        Ty::Map(value) => format!("Dict[str, {}]", py_type(*value)),
        Ty::Named(name) => name.into(),
    }
}

fn py_default(value: &str) -> String {
    match value {
        "true" => "True".into(),
        "false" => "False".into(),
        "[]" => "field(default_factory=list)".into(),
        "{}" => "field(default_factory=dict)".into(),
        other => other.into(),
    }
}

fn bases(name: &str, base: &str) -> String {
    if WITH_METHODS.contains(&name) {
        format!("_methods.{name}, {base}")
    } else {
        base.into()
    }
}

fn names(fields: &[&Field]) -> String {
    let quoted: Vec<String> = fields.iter().map(|f| format!("{:?}", f.name)).collect();
    format!("frozenset({{{}}})", quoted.join(", "))
}

fn emit_struct(out: &mut String, s: &Struct) {
    let _ = write!(
        out,
        "\n\n@dataclass(frozen=True)\nclass {}({}):\n    \"\"\"{}\"\"\"\n\n",
        s.name,
        bases(s.name, "Wire"),
        s.doc
    );
    let nullable: Vec<&Field> = s
        .fields
        .iter()
        .filter(|f| f.presence == Presence::Nullable)
        .collect();
    let omitted: Vec<&Field> = s
        .fields
        .iter()
        .filter(|f| matches!(f.presence, Presence::Default { omit: true, .. }))
        .collect();
    if !nullable.is_empty() {
        let _ = writeln!(out, "    NULLABLE = {}", names(&nullable));
    }
    if !omitted.is_empty() {
        let _ = writeln!(out, "    OMIT_DEFAULT = {}", names(&omitted));
    }
    if s.strict {
        out.push_str("    STRICT = True\n");
    }
    if !nullable.is_empty() || !omitted.is_empty() || s.strict {
        out.push('\n');
    }
    // Dataclasses put the fields without a default first.
    let (bare, defaulted): (Vec<&Field>, Vec<&Field>) = s
        .fields
        .iter()
        .partition(|f| matches!(f.presence, Presence::Required | Presence::Nullable));
    for f in bare.iter().chain(&defaulted) {
        let ty = py_type(f.ty);
        let _ = match f.presence {
            Presence::Required => writeln!(out, "    {}: {ty}", f.name),
            Presence::Nullable => writeln!(out, "    {}: Optional[{ty}]", f.name),
            Presence::Optional => writeln!(out, "    {}: Optional[{ty}] = None", f.name),
            Presence::Default { value, .. } => {
                writeln!(out, "    {}: {ty} = {}", f.name, py_default(value))
            }
        };
        if !f.doc.is_empty() {
            let _ = writeln!(out, "    \"\"\"{}\"\"\"", f.doc);
        }
    }
}

/// A union as one class of every kind's fields; `KINDS` says which apply to each kind
/// (required, then optional).
fn emit_union(out: &mut String, u: &Union) {
    let open = enum_named(u.kinds).is_some_and(|k| k.open);
    let _ = write!(
        out,
        "\n\n@dataclass(frozen=True)\nclass {}({}):\n    \"\"\"{} ``kind`` says which of the fields apply.\"\"\"\n\n",
        u.name,
        bases(u.name, "Tagged"),
        u.doc
    );
    out.push_str("    KINDS: ClassVar[Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]]] = {\n");
    for variant in u.variants {
        let (required, optional): (Vec<&Field>, Vec<&Field>) = variant
            .fields
            .iter()
            .partition(|f| f.presence == Presence::Required);
        let tuple = |fields: &[&Field]| {
            let quoted: Vec<String> = fields.iter().map(|f| format!("{:?}, ", f.name)).collect();
            format!("({})", quoted.concat().trim_end())
        };
        let _ = writeln!(
            out,
            "        {:?}: ({}, {}),",
            variant.kind,
            tuple(&required),
            tuple(&optional)
        );
    }
    out.push_str("    }\n");
    if !open {
        out.push_str("    CLOSED = True\n");
    }
    let _ = writeln!(out, "\n    kind: {}", u.kinds);
    for f in union_fields(u) {
        let _ = writeln!(out, "    {}: Optional[{}] = None", f.name, py_type(f.ty));
        if !f.doc.is_empty() {
            let _ = writeln!(out, "    \"\"\"{}\"\"\"", f.doc);
        }
    }
}
