"""``torch_xla.utils.utils.SampleGenerator``: the same sample, ``sample_count`` times."""


class SampleGenerator:
    def __init__(self, data, sample_count):
        self._data = data
        self._count = int(sample_count)

    def __len__(self):
        return self._count

    def __iter__(self):
        for _ in range(self._count):
            yield self._data
