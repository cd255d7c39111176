"""Scripts the bench runs as Ray jobs or plain processes (also shipped to Serve as py_modules)."""
