"""The fault suite: Jepsen-style runs of real `quire up` clusters under faults (issue 18)."""
