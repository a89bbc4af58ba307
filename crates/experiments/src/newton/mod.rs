//! The Newton's-law experiment of the paper's later versions: the orbit simulator ([`sim`]), the
//! symbolic regression that reads a force law back from forces ([`regress`]), and the experiment
//! itself ([`experiment`]): a transformer trained on orbits per attention variant, whose predicted
//! accelerations supply the forces.

pub mod experiment;
pub mod fit;
pub mod regress;
pub mod report;
pub mod sim;
