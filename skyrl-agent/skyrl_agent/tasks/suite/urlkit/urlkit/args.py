def parse_flags(argv: list[str]) -> tuple[dict[str, str | bool], list[str]]:
    """Split ``argv`` into flags and positional arguments.

    ``--name=value`` and ``--name value`` set a string; a ``--name`` followed by another flag or by nothing is
    ``True``; everything after ``--`` is positional.
    """
    flags: dict[str, str | bool] = {}
    positional: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            positional.extend(argv[index + 1 :])
            break
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if eq:
                flags[name] = value
            elif not argv[index + 1].startswith("--"):
                flags[name] = argv[index + 1]
                index += 1
            else:
                flags[name] = True
        else:
            positional.append(arg)
        index += 1
    return flags, positional
