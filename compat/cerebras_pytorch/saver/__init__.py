"""``cerebras_pytorch.saver`` (releases 1.7 to 2.1): the H5 checkpoint saver the Model Zoo's
runners call directly (``pt_h5_saver``)."""
