"""Switch programs for the torch operators innet's own programs (switch_programs/) leave out: PRODUCT and BXOR of
integers, which the ``innet`` group runs through the fabric (innet.integrations.torch.batch)."""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
PROD_FILE = os.path.join(HERE, "prod_allreduce.py")
XOR_FILE = os.path.join(HERE, "xor_allreduce.py")
