//! The one error type of the target system.

/// `Result` with [`TargetError`].
pub type TargetResult<T> = Result<T, TargetError>;

/// Everything that can go wrong while registering kinds and tags or building a target.
///
/// Every variant except the registration ones is a fault of the input: the caller should fix
/// the target string or config and try again. Registration variants are a fault of the
/// program that registers (a name used twice).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// The target string starts with `{` but is not valid JSON (TVM's message and position).
    #[error("malformed target JSON: {message}: line {line} column {column} (char {offset})")]
    Json {
        /// What the reader expected, e.g. `Expecting ',' delimiter`.
        message: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// 0-based character offset.
        offset: usize,
    },
    /// A legacy `kind -option=value` string that kiln cannot read.
    #[error("legacy target string {input:?}: {reason}")]
    Legacy {
        /// The whole string.
        input: String,
        /// What is wrong, and where.
        reason: String,
    },
    /// A string with a space where the legacy form is not accepted (inside a JSON config).
    #[error(
        "target string {input:?} uses the legacy `kind -option=value` form, which is only \
         accepted at the top level; inside a JSON config write the target as a JSON object"
    )]
    LegacyNotAllowed {
        /// The offending string.
        input: String,
    },
    /// A target given as a JSON value that is neither a string nor an object.
    #[error("a target must be a string or a JSON object, found {found}")]
    NotATarget {
        /// The type found.
        found: String,
    },
    /// The config has neither `kind` nor `tag`.
    #[error("target config has no field \"kind\" (nor a \"tag\" to take it from)")]
    MissingKind,
    /// `kind` is not a string.
    #[error("target field \"kind\" expects String, found {found}")]
    KindNotString {
        /// The type found.
        found: String,
    },
    /// No kind of that name is registered.
    #[error("target kind {name:?} is not defined{hint}; known kinds: {}", .known.join(", "))]
    UnknownKind {
        /// The name asked for.
        name: String,
        /// Every registered kind.
        known: Vec<String>,
        /// Empty, or a parenthesized suggestion starting with a space.
        hint: String,
    },
    /// `tag` (without `kind`) is not a string.
    #[error("target field \"tag\" expects String, found {found}")]
    TagNotString {
        /// The type found.
        found: String,
    },
    /// No tag of that name is registered.
    #[error("unknown target tag {name:?}{hint}; `kiln tags` lists all {count} tags")]
    UnknownTag {
        /// The name asked for.
        name: String,
        /// Empty, or a parenthesized suggestion starting with a space.
        hint: String,
        /// How many tags are registered.
        count: usize,
    },
    /// An option the kind does not declare.
    #[error(
        "target `{kind}`: unknown option `{option}`{hint}; known options: {}",
        .known.join(", ")
    )]
    UnknownOption {
        /// The target kind.
        kind: String,
        /// The option given.
        option: String,
        /// Every option of the kind, in declaration order.
        known: Vec<String>,
        /// Empty, or a parenthesized suggestion starting with a space.
        hint: String,
    },
    /// An option value of the wrong type.
    #[error("target `{kind}`: attribute `{option}` expects {expected}, found {found}")]
    TypeMismatch {
        /// The target kind.
        kind: String,
        /// The option.
        option: String,
        /// The declared type.
        expected: String,
        /// What was given (type, and for arrays the offending element).
        found: String,
    },
    /// `host` is neither a target, a string, a dict nor null.
    #[error("target field \"host\" expects a target, a string, an object or null, found {found}")]
    HostType {
        /// The type found.
        found: String,
    },
    /// An element of a `devices`-like array of targets is not a target, string or dict.
    #[error(
        "target `{kind}`: attribute `{option}` expects an array of targets, strings or objects, \
         found {found} at index {index}"
    )]
    TargetArrayElement {
        /// The target kind.
        kind: String,
        /// The option.
        option: String,
        /// Position in the array.
        index: usize,
        /// The type found.
        found: String,
    },
    /// A value of the right type that the kind's canonicalizer rejects (CUDA arch, ROCm gfx, ...).
    #[error("target `{kind}`: attribute `{option}` {message}")]
    InvalidValue {
        /// The target kind.
        kind: String,
        /// The option.
        option: String,
        /// What was expected and found, e.g. ``expects a CUDA arch `sm_XX`, found "80"``.
        message: String,
        /// TVM's error category for this check (`cuda_arch`, `rocm_gfx`, `fixed_attr`, ...).
        category: &'static str,
    },
    /// A user canonicalizer failed or produced a value the schema does not allow.
    #[error("target `{kind}`: canonicalizer: {message}")]
    Canonicalizer {
        /// The target kind.
        kind: String,
        /// The message.
        message: String,
    },
    /// An error inside a nested target (`host`, an element of `devices`).
    #[error("in `{path}`: {source}")]
    Nested {
        /// Dotted path from the outer target, e.g. `host.host` or `devices[1]`.
        path: String,
        /// The error of the nested target.
        source: Box<TargetError>,
    },
    /// A kind of that name is already registered.
    #[error("target kind `{0}` is already registered")]
    DuplicateKind(String),
    /// A kind declares the same option twice.
    #[error("target kind `{kind}`: option `{option}` is declared twice")]
    DuplicateOption {
        /// The kind being built.
        kind: String,
        /// The option.
        option: String,
    },
    /// A tag of that name is already registered.
    #[error("target tag `{0}` is already registered")]
    DuplicateTag(String),
    /// A tag config that is not a JSON object, or has no kind.
    #[error("target tag `{name}`: {message}")]
    InvalidTag {
        /// The tag.
        name: String,
        /// What is wrong.
        message: String,
    },
}

impl TargetError {
    /// TVM 0.27's error category for this error, as recorded in the conformance corpus
    /// (`type_mismatch`, `unknown_kind`, `json_parse`, ...). Nested errors report the inner one.
    pub fn category(&self) -> &'static str {
        match self {
            TargetError::Json { .. } => "json_parse",
            TargetError::Legacy { .. } | TargetError::LegacyNotAllowed { .. } => "cli_string",
            TargetError::NotATarget { .. } => "python_type",
            TargetError::MissingKind => "missing_kind",
            TargetError::KindNotString { .. } => "kind_not_string",
            TargetError::UnknownKind { .. } => "unknown_kind",
            TargetError::TagNotString { .. } => "tag_not_string",
            TargetError::UnknownTag { .. } => "unknown_tag",
            TargetError::UnknownOption { .. } => "unknown_option",
            TargetError::TypeMismatch { .. } => "type_mismatch",
            TargetError::HostType { .. } => "host_type",
            TargetError::TargetArrayElement { .. } => "composite_devices",
            TargetError::InvalidValue { category, .. } => category,
            TargetError::Canonicalizer { .. } => "canonicalizer",
            TargetError::Nested { source, .. } => source.category(),
            TargetError::DuplicateKind(_)
            | TargetError::DuplicateOption { .. }
            | TargetError::DuplicateTag(_)
            | TargetError::InvalidTag { .. } => "registration",
        }
    }

    /// Wraps `self` as an error of the nested target at `segment` (`host`, `devices[0]`).
    pub(crate) fn nested(self, segment: &str) -> TargetError {
        match self {
            TargetError::Nested { path, source } => TargetError::Nested {
                path: if path.starts_with('[') {
                    format!("{segment}{path}")
                } else {
                    format!("{segment}.{path}")
                },
                source,
            },
            other => TargetError::Nested {
                path: segment.to_string(),
                source: Box::new(other),
            },
        }
    }
}

/// `" (did you mean `x`?)"` for the closest of `candidates` to `name`, or an empty string.
pub(crate) fn suggest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    let lower = name.to_ascii_lowercase();
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = crate::util::edit_distance(&lower, &c.to_ascii_lowercase());
        let limit = (c.len().max(name.len()) / 3).max(1);
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    match best {
        Some((_, c)) => format!(" (did you mean `{c}`?)"),
        None => String::new(),
    }
}
