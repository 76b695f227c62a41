"""提取中文收据字段 (extracting fields from a Chinese receipt).

MNN-Pocket models are bilingual; the embedded default model is English-first, so expect
rougher values from it than from an MNN-Pocket build (pass model="path/to/config.json").
"""

import sys

from pydantic import BaseModel, Field

from pocket_agent import extract, load_model


class Receipt(BaseModel):
    商户: str = Field(description="商户名称 (merchant name)")
    日期: str = Field(description="交易日期 (date)")
    金额: float = Field(description="合计金额，数字 (total amount)")


TEXT = """\
星巴克咖啡（南京西路店）
日期：2024年3月8日 14:32
拿铁 大杯  ¥32.00
蓝莓麦芬   ¥18.00
合计：¥50.00
"""

model = load_model(sys.argv[1]) if len(sys.argv) > 1 else None
receipt = extract(TEXT, schema=Receipt, model=model)
print(receipt.model_dump_json(indent=2, ensure_ascii=False) if hasattr(receipt, "model_dump_json") else receipt)
