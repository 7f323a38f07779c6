// placeholder: the data pipeline lands with issue A.
