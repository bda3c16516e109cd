import os
print(f"module rank={os.environ['RANK']} name={__name__}")
