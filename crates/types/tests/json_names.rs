//! Enum values in JSON are spelled as the CLI takes them (lowercase), and the
//! capitalized names older versions wrote into the metadata still read.
use drove_types::{NodeState, ReplicationMode};

#[test]
fn test_node_states_and_modes_are_written_lowercase() {
    assert_eq!(serde_json::to_string(&NodeState::Up).unwrap(), r#""up""#);
    assert_eq!(
        serde_json::to_string(&NodeState::Down).unwrap(),
        r#""down""#
    );
    assert_eq!(
        serde_json::to_string(&ReplicationMode::Direct).unwrap(),
        r#""direct""#
    );
    assert_eq!(
        serde_json::to_string(&ReplicationMode::PrimaryCopy).unwrap(),
        r#""primary-copy""#
    );
    // The JSON name is the one the CLI parses.
    for m in [ReplicationMode::Direct, ReplicationMode::PrimaryCopy] {
        let json = serde_json::to_value(m).unwrap();
        let parsed: ReplicationMode = json.as_str().unwrap().parse().unwrap();
        assert_eq!(parsed, m);
    }
}

#[test]
fn test_the_names_older_versions_wrote_still_read() {
    for (old, new) in [(r#""Up""#, NodeState::Up), (r#""Down""#, NodeState::Down)] {
        assert_eq!(serde_json::from_str::<NodeState>(old).unwrap(), new);
    }
    for (old, new) in [
        (r#""Direct""#, ReplicationMode::Direct),
        (r#""PrimaryCopy""#, ReplicationMode::PrimaryCopy),
    ] {
        assert_eq!(serde_json::from_str::<ReplicationMode>(old).unwrap(), new);
    }
    assert!(serde_json::from_str::<NodeState>(r#""UP""#).is_err());
    assert!(serde_json::from_str::<ReplicationMode>(r#""primarycopy""#).is_err());
}
