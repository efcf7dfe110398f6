"""A helper package beside the lifecycle DAGs, imported only inside a job function's body."""


def double(x: int) -> int:
    return 2 * x
