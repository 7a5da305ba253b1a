//! Who a job's command runs as: a container image's `User` (`USER[:GROUP]`,
//! names or numbers), resolved as container runtimes resolve it, in the
//! image's own /etc/passwd and /etc/group (the agent runs chrooted in the
//! image). A user without a group gets the primary group its passwd entry
//! names, else 0. Read by hand: two colon-separated files, and the agent
//! must stay small and not link the C library's NSS.

use std::fs;

/// The uid and gid `user` names; `None` for an empty `user` (root).
pub fn ids(user: &[u8]) -> Result<Option<(u32, u32)>, String> {
    if user.is_empty() {
        return Ok(None);
    }
    let user = String::from_utf8_lossy(user);
    let (name, group) = match user.split_once(':') {
        Some((name, group)) => (name, Some(group)),
        None => (user.as_ref(), None),
    };
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    let entry = passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.len() > 3 && (fields[0] == name || fields[2] == name));
    let uid = match (name.parse::<u32>(), &entry) {
        (Ok(uid), _) => uid,
        (Err(_), Some(fields)) => number(fields[2], "/etc/passwd", name)?,
        (Err(_), None) => {
            return Err(format!(
                "the user {name:?} is not in the image's /etc/passwd"
            ))
        }
    };
    let gid = match group {
        Some(group) => match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group_id(group)?,
        },
        None => match &entry {
            Some(fields) => number(fields[3], "/etc/passwd", name)?,
            None => 0,
        },
    };
    Ok(Some((uid, gid)))
}

fn group_id(name: &str) -> Result<u32, String> {
    let groups = fs::read_to_string("/etc/group").unwrap_or_default();
    let entry = groups
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.len() > 2 && fields[0] == name)
        .ok_or_else(|| format!("the group {name:?} is not in the image's /etc/group"))?;
    number(entry[2], "/etc/group", name)
}

fn number(field: &str, file: &str, name: &str) -> Result<u32, String> {
    field
        .parse()
        .map_err(|_| format!("{file}'s entry for {name:?} has no number"))
}

#[cfg(test)]
mod tests {
    use super::ids;

    #[test]
    fn users_are_numbers_or_names_of_the_roots_files() {
        assert_eq!(ids(b"").unwrap(), None);
        assert_eq!(ids(b"1000:100").unwrap(), Some((1000, 100)));
        // The root these tests run in has a root user, whose group is 0.
        assert_eq!(ids(b"root").unwrap(), Some((0, 0)));
        assert_eq!(ids(b"root:root").unwrap(), Some((0, 0)));
        assert_eq!(ids(b"4321").unwrap(), Some((4321, 0)));
        let error = ids(b"nobody-here").unwrap_err();
        assert!(error.contains("/etc/passwd"), "{error}");
    }
}
