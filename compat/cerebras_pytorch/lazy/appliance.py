"""placeholder"""


def run_state():
    raise NotImplementedError
