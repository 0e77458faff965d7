-- Prints the launch variables of this rank (rlhost launch tests).
print(("env RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s MASTER=%s:%s"):format(
    os.getenv("RANK"), os.getenv("WORLD_SIZE"), os.getenv("LOCAL_RANK"),
    os.getenv("LOCAL_WORLD_SIZE"), os.getenv("MASTER_ADDR"), os.getenv("MASTER_PORT")))
