//! The version gate: a controller only reconciles AutoscalingRunnerSets whose `app.kubernetes.io/version` label is
//! compatible with its own build version (docs/reference/controllers.md, "The version gate").

/// Build version used when none is injected at build time (never compatible with a released chart).
pub const UNKNOWN_BUILD_VERSION: &str = "NA";

/// The ARC release lines whose charts and objects this controller replaces as they are: their sets carry
/// `app.kubernetes.io/version: 0.12.x` to `0.15.x` (ARC's master builds say 0.14.2), and a user who only changes
/// images must not see them deleted. This project's own versions stay below 0.12 until these lines are long gone
/// (docs/versioning.md).
pub const ARC_COMPATIBLE_VERSIONS: [&str; 4] = ["0.12", "0.13", "0.14", "0.15"];

/// Whether this controller (built as `build_version`) takes care of a set labelled `resource_version`: one of its
/// own version ([`is_version_allowed`]), one of its previous minor (a set whose scale-set chart is upgraded after
/// the controller's, as a platform team upgrades: the controller first, then each scale set), or one of the ARC
/// lines it replaces ([`ARC_COMPATIBLE_VERSIONS`]).
pub fn is_version_accepted(resource_version: &str, build_version: &str) -> bool {
    is_version_allowed(resource_version, build_version)
        || ARC_COMPATIBLE_VERSIONS
            .iter()
            .any(|line| is_version_allowed(resource_version, line))
        || previous_minor(build_version)
            .is_some_and(|previous| major_minor(resource_version) == Some(previous))
}

/// The minor release line before `build_version`'s (`0.2.x` → `0.1`), if it has one: a `.0` minor has none
/// (which line came before `1.0` is not known from the number).
fn previous_minor(build_version: &str) -> Option<(u64, u64)> {
    let (major, minor) = major_minor(build_version)?;
    Some((major, minor.checked_sub(1)?))
}

/// Whether an object labelled with `resource_version` may be reconciled by a controller built as
/// `build_version`.
///
/// True when the build is `dev`, when both are equal, when the build is a `canary-` build, or when both parse as
/// `MAJOR[.MINOR[.PATCH]]` (decimal, no leading zeros, no `v` prefix, no suffix; a missing minor is 0) with the
/// same major and minor. Anything unparseable is not allowed.
pub fn is_version_allowed(resource_version: &str, build_version: &str) -> bool {
    if build_version == "dev"
        || resource_version == build_version
        || build_version.starts_with("canary-")
    {
        return true;
    }
    match (major_minor(resource_version), major_minor(build_version)) {
        (Some(resource), Some(build)) => resource == build,
        _ => false,
    }
}

/// `(major, minor)` of a `MAJOR[.MINOR[.PATCH]]` version, `None` if it is not one.
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.split('.');
    let major = parse_number(parts.next()?)?;
    let minor = parts.next().map(parse_number).unwrap_or(Some(0))?;
    if let Some(patch) = parts.next() {
        parse_number(patch)?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor))
}

/// A decimal number without sign, leading zeros (except `0` itself) or anything else.
fn parse_number(s: &str) -> Option<u64> {
    let digits_only = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let leading_zero = s.len() > 1 && s.starts_with('0');
    if !digits_only || leading_zero {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_of_the_arc_line_it_replaces_are_accepted() {
        assert!(is_version_accepted("0.14.2", "0.1.0"));
        assert!(is_version_accepted("0.14.0", "0.1.0"));
        assert!(is_version_accepted("0.1.3", "0.1.0"));
        assert!(is_version_accepted("0.12.1", "0.1.0"));
        assert!(is_version_accepted("0.13.1", "0.1.0"));
        assert!(is_version_accepted("0.15.0", "0.1.0"));
        assert!(
            !is_version_accepted("0.11.0", "0.1.0"),
            "before the supported ARC lines"
        );
        assert!(!is_version_accepted("0.16.0", "0.1.0"));
        assert!(!is_version_accepted("0.2.0", "0.1.0"));
        assert!(!is_version_accepted("garbage", "0.1.0"));
    }

    #[test]
    fn sets_of_the_previous_minor_are_accepted_during_an_upgrade() {
        // The controller upgraded to 0.2 first; the scale sets' charts follow one by one.
        assert!(is_version_accepted("0.1.4", "0.2.0"));
        assert!(is_version_accepted("0.2.1", "0.2.0"));
        assert!(!is_version_accepted("0.0.9", "0.2.0"), "two minors back");
        assert!(
            !is_version_accepted("0.3.0", "0.2.0"),
            "a newer chart than the controller"
        );
        assert!(is_version_accepted("1.3.0", "1.4.2"));
        assert!(
            !is_version_accepted("0.9.0", "1.0.0"),
            "no known line before a .0 minor"
        );
    }

    #[test]
    fn spec_examples() {
        assert!(is_version_allowed("0.11.1", "0.11.0"));
        assert!(!is_version_allowed("0.11.0", "0.10.0"));
        assert!(!is_version_allowed("dev", "0.11.0"));
        assert!(!is_version_allowed("0.11.0", UNKNOWN_BUILD_VERSION));
    }

    #[test]
    fn dev_canary_and_equal_builds_allow_anything() {
        assert!(is_version_allowed("anything", "dev"));
        assert!(is_version_allowed("", "dev"));
        assert!(is_version_allowed("0.1.0", "canary-abc123"));
        assert!(is_version_allowed("not-a-version", "not-a-version"));
    }

    #[test]
    fn missing_minor_is_zero_and_patch_is_ignored() {
        assert!(is_version_allowed("1", "1.0.7"));
        assert!(is_version_allowed("1.0", "1"));
        assert!(!is_version_allowed("1", "1.1.0"));
        assert!(is_version_allowed("2.3.0", "2.3.99"));
    }

    #[test]
    fn malformed_versions_are_rejected() {
        for bad in [
            "v0.11.0",
            "0.11.0-rc.1",
            "0.011.0",
            "00.11.0",
            "0.11.0.1",
            "0..1",
            "",
            ".1",
            "0.11.",
            "-1.0",
        ] {
            assert!(!is_version_allowed(bad, "0.11.0"), "{bad}");
            assert!(!is_version_allowed("0.11.0", bad), "{bad}");
        }
    }
}
