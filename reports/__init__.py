"""What a run made, for people: the summary, status and errors, the HTML report, the visual-word gallery, and
validate. Everything here reads the work dir; nothing writes into the data folders."""
