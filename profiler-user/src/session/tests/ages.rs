//! The live samples' ages, and `--min-age`.

use super::*;

#[test]
fn live_bytes_are_split_by_age_and_min_age_keeps_only_the_old() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    world.spawn(100, "leaky");
    world.pass(Duration::from_secs(700));
    let (leak, cache) = (address_in(alpha_site), address_in(beta_site));
    for _ in 0..3 {
        world.sample_aged(100, 1, &[leak], 1 << 20, Duration::from_secs(700));
    }
    world.sample_aged(100, 2, &[cache], 8 << 20, Duration::from_secs(1));
    let p = s.complete_profile().unwrap();
    let stack = |p: &Profile, id: &str| {
        images(p, 100)[0]
            .stacks
            .iter()
            .find(|st| st.frames.iter().any(|f| f.function.contains(id)))
            .map(|st| st.totals)
            .unwrap()
    };
    let old = stack(&p, "alpha_site");
    assert_eq!(old.ages.over_old, old.live_bytes);
    assert_eq!(old.ages.over_very_old, old.live_bytes);
    assert!(old.ages.oldest >= Duration::from_secs(700));
    let young = stack(&p, "beta_site");
    assert_eq!(young.ages.over_old, 0.0);
    assert!(young.live_bytes > old.live_bytes, "the cache is larger now");
    assert_eq!(images(&p, 100)[0].totals.ages.over_old, old.live_bytes);

    // `--min-age 5s`: the leak alone is live that long.
    s.set_min_age(Duration::from_secs(5));
    let p = s.complete_profile().unwrap();
    assert_eq!(stack(&p, "alpha_site").live_bytes, old.live_bytes);
    assert_eq!(stack(&p, "beta_site").live_bytes, 0.0);
    assert_eq!(images(&p, 100)[0].totals.live_bytes, old.live_bytes);
}

#[test]
fn live_samples_are_read_for_their_ages_every_few_seconds_and_whenever_it_matters() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    world.spawn(100, "leaky");
    world.pass(Duration::from_secs(1000));
    let leak = address_in(alpha_site);
    world.sample_aged(100, 1, &[leak], 1 << 20, Duration::from_secs(100));
    let oldest = |p: &Profile| images(p, 100)[0].totals.ages.oldest;
    let first = s.complete_profile().unwrap();
    assert!(oldest(&first) >= Duration::from_secs(100));
    // An older sample shows at the next read of the live samples, not at a
    // refresh a moment later (the ages are kept from the last read).
    world.sample_aged(100, 1, &[leak], 1 << 20, Duration::from_secs(900));
    let soon = s.refresh().unwrap();
    assert!(
        oldest(&soon) < Duration::from_secs(900),
        "{:?}",
        oldest(&soon)
    );
    // A complete profile (the final one of a run, an export) reads them.
    let last = s.complete_profile().unwrap();
    assert!(oldest(&last) >= Duration::from_secs(900));
    // With a minimum age the live figures come from them: read every time.
    world.sample_aged(100, 1, &[leak], 1 << 20, Duration::from_secs(1000));
    s.set_min_age(Duration::from_secs(5));
    let now = s.refresh().unwrap();
    assert!(oldest(&now) >= Duration::from_secs(1000));
}
