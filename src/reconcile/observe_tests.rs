//! Tests of [`super`]'s listing and of how it hands each subject its
//! observation.
use super::*;
use crate::model::observation::ResourceStatus;
use crate::reconcile::PlannedSubject;
use std::time::SystemTime;

/// An observation of `database` whose external id says which answer it
/// came from.
fn seen(database: &str, answer: &str) -> Observation {
    Observation {
        database_name: database.into(),
        external_id: answer.into(),
        status: ResourceStatus::Ready,
        fields: Default::default(),
        labels: Default::default(),
        observed_at: SystemTime::UNIX_EPOCH,
        unobserved: Vec::new(),
    }
}

fn routed(database: &str) -> Routed<'static> {
    Routed {
        subject: PlannedSubject::Unreadable,
        database_name: database.to_string().into(),
        position: None,
    }
}

/// What each subject was handed: the external id, `-` for not found.
fn handed(observed: &[Observed]) -> Vec<String> {
    observed
        .iter()
        .map(|o| match o {
            Observed::Found(obs) => format!("{}:{}", obs.database_name, obs.external_id),
            Observed::NotFound => "-".into(),
            Observed::Failed(why) => format!("failed: {why}"),
        })
        .collect()
}

#[test]
fn each_subject_is_handed_the_observation_of_its_database_in_its_own_order() {
    let listing = Listing::new(vec![
        seen("c", "1"),
        seen("a", "1"),
        seen("zz", "1"),
        seen("b", "1"),
    ]);
    let subjects = [routed("b"), routed("missing"), routed("a"), routed("c")];
    assert_eq!(
        handed(&distribute(&subjects, Some(Ok(listing)))),
        ["b:1", "-", "a:1", "c:1"]
    );
}

#[test]
fn subjects_sharing_a_database_each_get_its_observation() {
    // A tombstone and a new declaration naming one database.
    let listing = Listing::new(vec![seen("shared", "1"), seen("own", "1")]);
    let subjects = [routed("shared"), routed("own"), routed("shared")];
    assert_eq!(
        handed(&distribute(&subjects, Some(Ok(listing)))),
        ["shared:1", "own:1", "shared:1"]
    );
}

#[test]
fn of_two_answers_for_one_name_the_later_stands() {
    let listing = Listing::new(vec![seen("a", "first"), seen("b", "1"), seen("a", "later")]);
    assert_eq!(
        handed(&distribute(&[routed("a"), routed("b")], Some(Ok(listing)))),
        ["a:later", "b:1"]
    );
}

#[test]
fn an_insert_replaces_or_adds_and_a_remove_forgets() {
    let mut listing = Listing::new(vec![seen("b", "1"), seen("d", "1")]);
    listing.insert(seen("b", "2"));
    listing.insert(seen("a", "2"));
    listing.insert(seen("c", "2"));
    assert_eq!(listing.remove("d").map(|o| o.external_id), Some("1".into()));
    assert_eq!(listing.remove("d"), None);
    let subjects = [routed("a"), routed("b"), routed("c"), routed("d")];
    assert_eq!(
        handed(&distribute(&subjects, Some(Ok(listing)))),
        ["a:2", "b:2", "c:2", "-"]
    );
}

#[test]
fn a_provider_that_could_not_be_asked_fails_every_subject() {
    let subjects = [routed("a"), routed("b")];
    assert_eq!(
        handed(&distribute(&subjects, Some(Err("refused".into())))),
        ["failed: refused", "failed: refused"]
    );
    assert_eq!(
        handed(&distribute(&subjects, None)),
        [
            "failed: the provider was not observed",
            "failed: the provider was not observed"
        ]
    );
}
