-- Prints the launch variables of this rank or role (rlhost launch tests).
if os.getenv("RL_ROLE") then
    print(("role %s %s/%s RANK=%s"):format(os.getenv("RL_ROLE"), os.getenv("RL_ROLE_INDEX"),
        os.getenv("RL_ROLE_COUNT"), tostring(os.getenv("RANK"))))
end
print(("env RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s MASTER=%s:%s"):format(
    os.getenv("RANK"), os.getenv("WORLD_SIZE"), os.getenv("LOCAL_RANK"),
    os.getenv("LOCAL_WORLD_SIZE"), os.getenv("MASTER_ADDR"), os.getenv("MASTER_PORT")))
