//! The element types the reference accepts (`f32`, `f64`); all arithmetic is done in `f64`.

/// A floating-point element type of the public arrays. The reference widens every input to
/// `f64`, computes in `f64`, and narrows the result back (round to nearest).
pub trait Real: num_traits::Float + std::fmt::Debug + std::fmt::Display + Send + Sync + 'static {
    /// Widen to `f64` (exact for `f32` and `f64`).
    fn into_f64(self) -> f64;
    /// Narrow from `f64` (round to nearest; may overflow to infinity for `f32`).
    fn from_f64(x: f64) -> Self;
    /// The type's name, for messages.
    const NAME: &'static str;
}

impl Real for f32 {
    fn into_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    const NAME: &'static str = "f32";
}

impl Real for f64 {
    fn into_f64(self) -> f64 {
        self
    }
    fn from_f64(x: f64) -> Self {
        x
    }
    const NAME: &'static str = "f64";
}
