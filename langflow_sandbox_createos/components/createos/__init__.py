"""The `createos` bundle: lfx loads every module here except this one, file by file."""
