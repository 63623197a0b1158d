// JSON to typed values and back, checked: the one place that knows how the protocol's
// objects map to TypeScript values. A decoder copies the keys it knows (a newer daemon's
// extra keys are left out) and fails on a key of the wrong type.

/** Decodes a parsed JSON value as a T, and encodes a T back. */
export interface Codec<T> {
  decode(value: unknown, path: string): T;
  encode(value: T): unknown;
}

/** The malformed value and where it was. */
export class DecodeError extends Error {}

function fail(path: string, what: string, value: unknown): never {
  throw new DecodeError(`${path}: expected ${what}, got ${JSON.stringify(value)}`);
}

function primitive<T>(what: string, test: (v: unknown) => boolean): Codec<T> {
  return {
    decode: (v, path) => (test(v) ? (v as T) : fail(path, what, v)),
    encode: (v) => v,
  };
}

export const int = primitive<number>("an integer", (v) => Number.isSafeInteger(v));
export const str = primitive<string>("a string", (v) => typeof v === "string");
export const bool = primitive<boolean>("a boolean", (v) => typeof v === "boolean");
/** One of the strings given. */
export function oneOf<T extends string>(...values: T[]): Codec<T> {
  return primitive<T>(`one of ${values.join(", ")}`, (v) => values.includes(v as T));
}
/** Any JSON, as it is. */
export const json = primitive<unknown>("JSON", () => true);

export function arrayOf<T>(item: Codec<T>): Codec<T[]> {
  return {
    decode: (v, path) =>
      Array.isArray(v) ? v.map((x, i) => item.decode(x, `${path}[${i}]`)) : fail(path, "an array", v),
    encode: (v) => v.map((x) => item.encode(x)),
  };
}

export function recordOf<T>(value: Codec<T>): Codec<Record<string, T>> {
  return {
    decode: (v, path) => {
      if (typeof v !== "object" || v === null || Array.isArray(v)) fail(path, "an object", v);
      const out: Record<string, T> = {};
      for (const [k, x] of Object.entries(v as object)) out[k] = value.decode(x, `${path}.${k}`);
      return out;
    },
    encode: (v) => Object.fromEntries(Object.entries(v).map(([k, x]) => [k, value.encode(x)])),
  };
}

/** An object tagged by `kind`: each kind's codec; other kinds are refused. */
export function tagged<T extends { kind: string }>(
  what: string,
  variants: { [K in T["kind"]]: Codec<Extract<T, { kind: K }>> },
): Codec<T> {
  const codecs = variants as unknown as Record<string, Codec<T>>;
  const of = (kind: unknown): Codec<T> | undefined =>
    typeof kind === "string" && Object.prototype.hasOwnProperty.call(codecs, kind) ? codecs[kind] : undefined;
  return {
    decode: (v, path) => {
      const kind = (v as { kind?: unknown } | null)?.kind;
      const codec = of(kind);
      if (codec === undefined) throw new DecodeError(`${path}: ${what} of unknown kind ${JSON.stringify(kind)}`);
      return codec.decode(v, path);
    },
    encode: (v) => {
      const codec = of(v.kind);
      if (codec === undefined) throw new DecodeError(`${what} of unknown kind ${JSON.stringify(v.kind)}`);
      return codec.encode(v);
    },
  };
}

/** How a field is written, and read when absent. */
export interface Field<T> {
  codec: Codec<T>;
  /** absent: "required" fails, "null" reads null, "omit" reads undefined, "default" the default. */
  absent: "required" | "null" | "omit" | "default";
  fallback?: T;
  /** With "default": leave the key out when it holds the default. */
  omitDefault?: boolean;
}

export const required = <T>(codec: Codec<T>): Field<T> => ({ codec, absent: "required" });
/** Written as null when it does not apply. */
export const nullable = <T>(codec: Codec<T>): Field<T | null> => ({
  codec: { decode: (v, p) => (v === null ? null : codec.decode(v, p)), encode: (v) => (v === null ? null : codec.encode(v)) },
  absent: "null",
});
/** Left out when it does not apply (null is read as absent). */
export const optional = <T>(codec: Codec<T>): Field<T | undefined> => ({
  codec: codec as Codec<T | undefined>,
  absent: "omit",
});
/** Read as `fallback` when absent; left out when it holds it, with `omitDefault`. */
export const defaulted = <T>(codec: Codec<T>, fallback: T, omitDefault = false): Field<T> => ({
  codec,
  absent: "default",
  fallback,
  omitDefault,
});

type Fields<T> = { [K in keyof T]-?: Field<T[K]> };

/** An object of known fields; `strict` also refuses keys it does not know. */
export function object<T>(fields: Fields<T>, strict = false): Codec<T> {
  const entries = Object.entries(fields) as [string, Field<unknown>][];
  return {
    decode: (v, path) => {
      if (typeof v !== "object" || v === null || Array.isArray(v)) fail(path, "an object", v);
      const value = v as Record<string, unknown>;
      if (strict) {
        const unknown = Object.keys(value).filter((k) => !(k in fields));
        if (unknown.length > 0) throw new DecodeError(`${path}: unknown fields ${unknown.join(", ")}`);
      }
      const out: Record<string, unknown> = {};
      for (const [key, field] of entries) {
        const x = value[key];
        if (x === undefined || (x === null && field.absent === "omit")) {
          if (field.absent === "required") fail(`${path}.${key}`, "a value", x);
          out[key] = field.absent === "null" ? null : field.absent === "default" ? field.fallback : undefined;
          if (out[key] === undefined) delete out[key];
        } else {
          out[key] = field.codec.decode(x, `${path}.${key}`);
        }
      }
      return out as T;
    },
    encode: (v) => {
      const out: Record<string, unknown> = {};
      for (const [key, field] of entries) {
        const x = (v as Record<string, unknown>)[key];
        if (x === undefined) continue;
        if (field.omitDefault && JSON.stringify(x) === JSON.stringify(field.fallback)) continue;
        out[key] = field.codec.encode(x);
      }
      return out;
    },
  };
}
