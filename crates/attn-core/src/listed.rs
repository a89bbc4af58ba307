//! [`listed_enum!`](crate::listed_enum): an enum whose list of variants and whose names are declared
//! once, for the closed sets the kernels dispatch on (built-in activations, CUDA kernels and lab
//! versions). A new variant is one line; the compiler then points at every `match` that must handle
//! it, and no separate list (`ALL`) or name table can miss it.

/// Declares an enum of unit variants, each with a name, and `ALL` (every variant, in declaration
/// order) and `name()` (its name) from the one list:
///
/// ```
/// attn_core::listed_enum! {
///     /// A colour.
///     #[derive(Clone, Copy, Debug, PartialEq)]
///     pub enum Colour {
///         /// The first.
///         Red => "red",
///         Green => "green",
///     }
/// }
/// assert_eq!(Colour::ALL, [Colour::Red, Colour::Green]);
/// assert_eq!(Colour::Green.name(), "green");
/// ```
#[macro_export]
macro_rules! listed_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[doc = $doc:literal])* $variant:ident => $label:literal,)* }) => {
        $(#[$meta])*
        $vis enum $name {
            $($(#[doc = $doc])* $variant,)*
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$($label),*].len()] = [$($name::$variant),*];

            /// The variant's stable name.
            pub const fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)*
                }
            }
        }
    };
}
