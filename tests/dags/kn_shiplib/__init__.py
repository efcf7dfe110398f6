"""A helper package of the DAG folder, imported only inside job functions (never at module level)."""

GREETING = "hello from the DAG folder"


def greet(name: str) -> str:
    return f"{GREETING}, {name}"


def refuse(name: str) -> str:
    raise ValueError(f"no greeting for {name}")
