//! The store conformance suite: every behaviour the commands and the dispatcher rely on,
//! asserted only through the `Store` trait, run unchanged against each engine. `suite` holds
//! the story, generic over `S: Store`; each engine's module opens a fresh, empty namespace per
//! test and instantiates the suite with `conformance!`.

mod mongo;
mod postgres;
pub(crate) mod suite;

/// One `#[test]` per suite function, each on a fresh namespace from `$open`.
macro_rules! conformance {
    ($open:path; $($test:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                let rt = crate::common::runtime();
                let namespace = $open(stringify!($test));
                rt.block_on(crate::conformance::suite::$test(&namespace.store));
            }
        )*
    };
}
pub(crate) use conformance;
