// placeholder: the trainer lands with issue A.
