"""Documents for bench/extract_wild.py: written for this benchmark, never used to tune anything.

108 documents of six kinds (``note``, ``email``, ``contact``, ``invoice``, ``receipt``, ``notice``),
18 of each: 10 in English and 8 in Chinese. Each is a dict ``{id, kind, lang, text, expected}``;
``expected`` names the fields the text holds, with the value as the text prints it (money as a
plain decimal string: ``"1234.50"`` for ``$1,234.50``). A schema field the dict leaves out is
expected to be None; a *required* field left out (documents with nothing to extract, like
"The weather is nice today." read as an invoice) is not scored.

Conventions for the expected values:

- names leave out greetings, honorifics and titles: ``尊敬的王小明先生`` -> ``王小明``,
  ``Dear Ms. Emily Carter`` -> ``Emily Carter``, ``周文博 博士`` -> ``周文博``;
- a generic addressee (``Dear Customer``, ``各位家长``, ``Hello team``) is no recipient;
- relative days (``周六``, ``this Thursday``) are no date; a time range's time is its start;
- ``Email.date`` is the one date an e-mail mentions (each e-mail mentions at most one);
- a merchant is its brand as printed, without branch or store number;
- currency is the marker as printed (``$``, ``EUR``, ``元``, ``人民币``); scoring maps the usual
  symbols, codes and words of one currency to one code.
"""

from __future__ import annotations

from typing import Any


def _doc(kind: str, lang: str, n: int, text: str, **expected: str) -> dict[str, Any]:
    return {"id": f"{kind}-{lang}-{n:02d}", "kind": kind, "lang": lang, "text": text.strip("\n"), "expected": expected}


DOCS: list[dict[str, Any]] = [
    # -- short notes: person, date, time, phone, amount ------------------------------------------
    _doc(
        "note",
        "en",
        1,
        "Call Anita Patel back about the lab results — her number is 555-0142.",
        person="Anita Patel",
        phone="555-0142",
    ),
    _doc(
        "note",
        "en",
        2,
        "Lent Marcus $45 for concert tickets on 3/14/2026. He says he'll pay me back next week.",
        person="Marcus",
        date="3/14/2026",
        amount="45",
    ),
    _doc(
        "note",
        "en",
        3,
        "Dentist appt 10:30am, 12 May 2026. Bring insurance card. Co-pay $25.00",
        date="12 May 2026",
        time="10:30am",
        amount="25.00",
    ),
    _doc("note", "en", 4, "groceries: milk, eggs, bread, coffee beans. spent 38.70 total", amount="38.70"),
    _doc(
        "note",
        "en",
        5,
        "Pick up Lily from swim practice at 5:15 PM on Thursday, June 4, 2026.",
        person="Lily",
        date="June 4, 2026",
        time="5:15 PM",
    ),
    _doc(
        "note",
        "en",
        6,
        "Remember: the plumber (Greg Hollis, 07700 900123) comes 8am on 2026-04-22. Quote was £180.",
        person="Greg Hollis",
        phone="07700 900123",
        time="8am",
        date="2026-04-22",
        amount="180",
    ),
    _doc("note", "en", 7, "Idea for the team offsite: a cooking class instead of bowling?"),
    _doc(
        "note",
        "en",
        8,
        "Pay rent (1,450.00) - landlord is Mrs. Okafor, tel. 212-555-0198, prefers bank transfer.",
        person="Okafor",
        phone="212-555-0198",
        amount="1450.00",
    ),
    _doc(
        "note",
        "en",
        9,
        "Meeting w/ Tom Becker 14:00 on 04.03.2026 re budget; he'll call from +49 30 1234567",
        person="Tom Becker",
        time="14:00",
        date="04.03.2026",
        phone="+49 30 1234567",
    ),
    _doc(
        "note",
        "en",
        10,
        "Parking ticket - $65 fine, pay online by 30 April 2026. Ref PX-55821.",
        amount="65",
        date="30 April 2026",
    ),
    _doc(
        "note",
        "zh",
        1,
        "下午三点给李娜回电话，她的手机号是138 0013 8000。",
        person="李娜",
        phone="138 0013 8000",
        time="下午三点",
    ),
    _doc(
        "note", "zh", 2, "2026年3月4日 借给张伟500元买书，月底前还。", person="张伟", date="2026年3月4日", amount="500"
    ),
    _doc("note", "zh", 3, "周六上午10:00 带孩子去打疫苗，记得带户口本。", time="上午10:00"),
    _doc("note", "zh", 4, "超市购物：牛奶、鸡蛋、面包，共花费 ¥86.50", amount="86.50"),
    _doc(
        "note",
        "zh",
        5,
        "王建国医生的诊所电话：021-6234 5678，复诊时间 4月18日 下午2:30，挂号费 50 元。",
        person="王建国",
        phone="021-6234 5678",
        date="4月18日",
        time="下午2:30",
        amount="50",
    ),
    _doc("note", "zh", 6, "今天天气很好，适合去公园散步。"),
    _doc(
        "note",
        "zh",
        7,
        "交物业费 1,280.00 元，截止 2026/05/31。物业办公室电话 0755-8888 1234。",
        amount="1280.00",
        date="2026/05/31",
        phone="0755-8888 1234",
    ),
    _doc("note", "zh", 8, "周五晚上7点和陈静吃饭，地点待定。", person="陈静", time="晚上7点"),
    # -- e-mails: sender, recipient, date, order_number, amount ----------------------------------
    _doc(
        "email",
        "en",
        1,
        """
From: Karen Liu <karen.liu@brightpath.io>
To: Daniel Ortiz <d.ortiz@fastmail.com>
Date: Tue, 3 Mar 2026 09:14:52 +0000
Subject: Your refund

Hi Daniel,

We have processed the refund for order #A-77310. The amount of $129.99 will appear on your card
within 5 business days.

Best,
Karen
""",
        sender="Karen Liu",
        recipient="Daniel Ortiz",
        date="3 Mar 2026",
        order_number="A-77310",
        amount="129.99",
    ),
    _doc(
        "email",
        "en",
        2,
        """
Hello team,

Just a reminder that the office will be closed on Monday for the public holiday. Enjoy the long weekend!

Cheers,
Priya
""",
        sender="Priya",
    ),
    _doc(
        "email",
        "en",
        3,
        """
Dear Mr. Harrison,

Thank you for your order (Order No. 2026-04418) placed on 15/02/2026. Your total comes to €2,340.00
including VAT. We will ship within 3 days.

Kind regards,
Sofia Marchetti
Customer Service, Lumina Lighting
""",
        sender="Sofia Marchetti",
        recipient="Harrison",
        date="15/02/2026",
        order_number="2026-04418",
        amount="2340.00",
    ),
    _doc(
        "email",
        "en",
        4,
        """
Subject: Re: lunch?

Sounds good, see you at noon. - Mike
""",
        sender="Mike",
    ),
    _doc(
        "email",
        "en",
        5,
        """
Your package is on its way!

Order ID: 113-4478291-5562210
Shipped: March 9, 2026

Questions? Call 1-800-555-0175.
""",
        date="March 9, 2026",
        order_number="113-4478291-5562210",
    ),
    _doc(
        "email",
        "en",
        6,
        """
Hi Jenna,

The invoice for the February workshop is attached - 3,200 USD, payable within 30 days. Let me know if
you need a PO number.

Thanks,
Oliver Grant
Grant & Co. | +44 20 7946 0958
""",
        sender="Oliver Grant",
        recipient="Jenna",
        amount="3200",
    ),
    _doc(
        "email",
        "en",
        7,
        """
From: noreply@citybank.com
Sent: 04/02/2026 18:22
To: Rachel Kim
Subject: Payment received

Dear Rachel Kim, we received your payment of USD 560.75 on the account ending 4421.
""",
        sender="noreply@citybank.com",
        recipient="Rachel Kim",
        date="04/02/2026",
        amount="560.75",
    ),
    _doc(
        "email",
        "en",
        8,
        "Hey Sam - can you send me the slides from yesterday? Need them for the 3pm call. Thx, Alex",
        sender="Alex",
        recipient="Sam",
    ),
    _doc(
        "email",
        "en",
        9,
        """
Dear Customer,

Your subscription renewal (order 558120) failed on 2026-03-01. The amount due is $9.99.
Please update your payment details.

Streamly Billing
""",
        sender="Streamly Billing",
        date="2026-03-01",
        order_number="558120",
        amount="9.99",
    ),
    _doc(
        "email",
        "en",
        10,
        """
Good morning Professor Whitfield,

I am writing to ask whether I could join your seminar next term. I have attached my transcript.

Respectfully,
Hannah Osei
""",
        sender="Hannah Osei",
        recipient="Whitfield",
    ),
    _doc(
        "email",
        "zh",
        1,
        """
尊敬的王小明先生：
您好！您于2026年3月2日提交的订单（订单号：DD20260302115）已发货，订单金额为￥1,299.00。如有疑问请致电客服 400-820-1234。
京东客服 刘芳
""",
        sender="刘芳",
        recipient="王小明",
        date="2026年3月2日",
        order_number="DD20260302115",
        amount="1299.00",
    ),
    _doc(
        "email",
        "zh",
        2,
        """
各位同事：
本周五下午公司将进行消防演练，请大家提前做好准备。
行政部 赵敏
""",
        sender="赵敏",
    ),
    _doc(
        "email",
        "zh",
        3,
        """
发件人：陈晓东 <chenxd@huaxin.com.cn>
收件人：李静
日期：2026-04-10
主题：报价单

李经理，您好：
附件是贵司所需设备的报价单，合计人民币 48,600 元，有效期30天。
陈晓东
""",
        sender="陈晓东",
        recipient="李静",
        date="2026-04-10",
        amount="48600",
    ),
    _doc(
        "email",
        "zh",
        4,
        """
亲爱的张丽华女士，
感谢您的购买！您的退款 ¥58.80 已原路退回，订单编号 7781-2290-3345。
淘宝售后
""",
        sender="淘宝售后",
        recipient="张丽华",
        order_number="7781-2290-3345",
        amount="58.80",
    ),
    _doc(
        "email",
        "zh",
        5,
        """
小周：
晚上的聚餐改到7点半了，地点不变。
—— 阿杰
""",
        sender="阿杰",
        recipient="小周",
    ),
    _doc(
        "email",
        "zh",
        6,
        """
尊敬的客户：
您的话费账单已出，本期应缴金额 128.50 元，请于2026年5月15日前缴纳。客服热线 10086。
中国移动
""",
        sender="中国移动",
        date="2026年5月15日",
        amount="128.50",
    ),
    _doc(
        "email",
        "zh",
        7,
        """
From: 黄磊
To: 孙悦
Sent: 2026/03/18 10:05
Subject: 合同

孙总，合同已经盖章，明天寄出。订单号 HT-2026-0318。
""",
        sender="黄磊",
        recipient="孙悦",
        date="2026/03/18",
        order_number="HT-2026-0318",
    ),
    _doc(
        "email",
        "zh",
        8,
        """
您好，
附件为3月份的差旅报销单，共计 3,456.70 元，请审批。
谢谢！
财务部 周婷婷
电话：010-6552 3344
""",
        sender="周婷婷",
        amount="3456.70",
    ),
    # -- e-mail signatures and business cards: name, email, phone, company, title -----------------
    _doc(
        "contact",
        "en",
        1,
        """
--
Michael Chen
Senior Software Engineer | Northwind Analytics
michael.chen@northwind-analytics.com
+1 (206) 555-0187
""",
        name="Michael Chen",
        title="Senior Software Engineer",
        company="Northwind Analytics",
        email="michael.chen@northwind-analytics.com",
        phone="+1 (206) 555-0187",
    ),
    _doc("contact", "en", 2, "Best regards,\nEmma Rossi", name="Emma Rossi"),
    _doc(
        "contact",
        "en",
        3,
        """
DR. SARAH OKONKWO
Pediatrician
Riverside Children's Clinic
T: 617.555.0123  F: 617.555.0124
sokonkwo@riversidekids.org
""",
        name="SARAH OKONKWO",
        title="Pediatrician",
        company="Riverside Children's Clinic",
        phone="617.555.0123",
        email="sokonkwo@riversidekids.org",
    ),
    _doc(
        "contact",
        "en",
        4,
        "James O'Neill · Sales Director\nMobile 07911 123456",
        name="James O'Neill",
        title="Sales Director",
        phone="07911 123456",
    ),
    _doc("contact", "en", 5, "Thanks,\nAva\n\nSent from my iPhone", name="Ava"),
    _doc(
        "contact",
        "en",
        6,
        """
Laura Fernández
Head of Partnerships
Solaria Energy S.L.
laura.fernandez@solaria.es
""",
        name="Laura Fernández",
        title="Head of Partnerships",
        company="Solaria Energy S.L.",
        email="laura.fernandez@solaria.es",
    ),
    _doc(
        "contact",
        "en",
        7,
        """
KESTREL DESIGN STUDIO
Tom Whitaker
Creative Director
www.kestreldesign.co
tom@kestreldesign.co | 555 201 7788
""",
        name="Tom Whitaker",
        title="Creative Director",
        company="KESTREL DESIGN STUDIO",
        email="tom@kestreldesign.co",
        phone="555 201 7788",
    ),
    _doc(
        "contact",
        "en",
        8,
        "Regards,\nRaj Malhotra\nraj.malhotra@gmail.com",
        name="Raj Malhotra",
        email="raj.malhotra@gmail.com",
    ),
    _doc("contact", "en", 9, "The weather is nice today. Let's go for a walk after lunch."),
    _doc(
        "contact",
        "en",
        10,
        "Nina Petrova | Procurement Manager | Baltic Freight Ltd. | Tel +371 6712 3456",
        name="Nina Petrova",
        title="Procurement Manager",
        company="Baltic Freight Ltd.",
        phone="+371 6712 3456",
    ),
    _doc(
        "contact",
        "zh",
        1,
        """
张伟
市场部经理
上海星辰科技有限公司
手机：139 1234 5678
邮箱：zhangwei@xingchen-tech.cn
""",
        name="张伟",
        title="市场部经理",
        company="上海星辰科技有限公司",
        phone="139 1234 5678",
        email="zhangwei@xingchen-tech.cn",
    ),
    _doc("contact", "zh", 2, "此致\n敬礼！\n刘洋", name="刘洋"),
    _doc(
        "contact",
        "zh",
        3,
        """
北京华远律师事务所
合伙人
王芳
电话：010-8523 6677  传真：010-8523 6678
""",
        name="王芳",
        title="合伙人",
        company="北京华远律师事务所",
        phone="010-8523 6677",
    ),
    _doc(
        "contact",
        "zh",
        4,
        "——\n李明 | 产品总监\nlimingpm@163.com",
        name="李明",
        title="产品总监",
        email="limingpm@163.com",
    ),
    _doc(
        "contact",
        "zh",
        5,
        """
杭州云帆网络有限公司
深圳市南山区科技园 腾飞大厦 12楼
销售代表 陈思远
手机：186 0755 3322
""",
        name="陈思远",
        title="销售代表",
        company="杭州云帆网络有限公司",
        phone="186 0755 3322",
    ),
    _doc("contact", "zh", 6, "会议室的投影仪坏了，已经报修。"),
    _doc("contact", "zh", 7, "谢谢！\n小林\n发自我的华为手机", name="小林"),
    _doc(
        "contact",
        "zh",
        8,
        """
周文博 博士
首席科学家
中科智能研究院
Email: zhouwb@casai.org.cn
""",
        name="周文博",
        title="首席科学家",
        company="中科智能研究院",
        email="zhouwb@casai.org.cn",
    ),
    # -- invoices: invoice_number, total, currency, date, due_date -------------------------------
    _doc(
        "invoice",
        "en",
        1,
        """
INVOICE
Invoice No: INV-2026-0412
Date: 2026-03-04
Due Date: 2026-04-03

Bill To: Harbor Coffee Roasters
Description                Qty   Unit Price     Amount
Website maintenance         1      1,200.00   1,200.00
Hosting (annual)            1        240.00     240.00
Subtotal                                      1,440.00
VAT 20%                                         288.00
Total (GBP)                                   1,728.00
""",
        invoice_number="INV-2026-0412",
        total="1728.00",
        currency="GBP",
        date="2026-03-04",
        due_date="2026-04-03",
    ),
    _doc(
        "invoice",
        "en",
        2,
        """
Invoice #10482
Issued 4 March 2026
Amount due: $845.50
Payment terms: due on receipt
Questions: billing@quickprint.com or 555-013-2200
""",
        invoice_number="10482",
        total="845.50",
        currency="$",
        date="4 March 2026",
    ),
    _doc(
        "invoice",
        "en",
        3,
        """
Tax Invoice
ABN 51 824 753 556
Invoice number: 00731
Invoice date: 03/04/2026
Due: 17/04/2026
Consulting services - March   AUD 4,950.00
GST                           AUD   495.00
TOTAL                         AUD 5,445.00
""",
        invoice_number="00731",
        total="5445.00",
        currency="AUD",
        date="03/04/2026",
        due_date="17/04/2026",
    ),
    _doc(
        "invoice",
        "en",
        4,
        """
From: Evergreen Landscaping
To: Mr. and Mrs. Dalton
Lawn care, hedge trimming, leaf removal
Total: 375
""",
        total="375",
    ),
    _doc("invoice", "en", 5, "The weather is nice today."),
    _doc(
        "invoice",
        "en",
        6,
        """
INVOICE NO. BR-5521
Billed on: Jan 15, 2026
Payment due: Feb 14, 2026
Item: Conference booth rental
Amount: EUR 12,000.00
Please reference the invoice number with your bank transfer. IBAN DE89 3704 0044 0532 0130 00
""",
        invoice_number="BR-5521",
        total="12000.00",
        currency="EUR",
        date="Jan 15, 2026",
        due_date="Feb 14, 2026",
    ),
    _doc(
        "invoice",
        "en",
        7,
        """
Freelance translation - invoice 2026/017
Client: Novak Publishing
Pages: 42 x 18.00
Total due: 756.00 USD
Please pay within 14 days.
""",
        invoice_number="2026/017",
        total="756.00",
        currency="USD",
    ),
    _doc(
        "invoice",
        "en",
        8,
        """
STATEMENT / INVOICE
Account: 88-2301-7
Invoice: Q-4471
Period: February 2026
Electricity usage 612 kWh
Amount payable ₹ 4,318.40
Pay by 2026-03-20
""",
        invoice_number="Q-4471",
        total="4318.40",
        currency="₹",
        due_date="2026-03-20",
    ),
    _doc(
        "invoice",
        "en",
        9,
        "Hi Carla, here's the invoice for the photos: #PH-0093, 650 dollars total. Due by May 1, 2026. Thanks! - Ben",
        invoice_number="PH-0093",
        total="650",
        currency="dollars",
        due_date="May 1, 2026",
    ),
    _doc(
        "invoice",
        "en",
        10,
        "Invoice\nNo. 7742\nDate 12.03.2026\nTotal CHF 1'980.00",
        invoice_number="7742",
        total="1980.00",
        currency="CHF",
        date="12.03.2026",
    ),
    _doc(
        "invoice",
        "zh",
        1,
        """
增值税普通发票
发票号码：04412987
开票日期：2026年3月4日
购买方：北京博雅文化传媒有限公司
项目：设计服务费
价税合计（大写）：壹万贰仟叁佰肆拾伍元整
价税合计（小写）：¥12,345.00
""",
        invoice_number="04412987",
        total="12345.00",
        currency="¥",
        date="2026年3月4日",
    ),
    _doc(
        "invoice",
        "zh",
        2,
        """
发票
编号：FP-2026-0088
日期：2026-02-28
金额：8,800.00元
付款期限：2026-03-31
""",
        invoice_number="FP-2026-0088",
        total="8800.00",
        currency="元",
        date="2026-02-28",
        due_date="2026-03-31",
    ),
    _doc(
        "invoice",
        "zh",
        3,
        """
收款单位：杭州绿源物业管理有限公司
物业费（2026年1月-3月）
合计：人民币 2,160.00 元
联系电话：0571-8876 5432
""",
        total="2160.00",
        currency="人民币",
    ),
    _doc("invoice", "zh", 4, "请大家下班前关好门窗，注意安全。"),
    _doc(
        "invoice",
        "zh",
        5,
        """
广州市天河区悦来餐饮有限公司 发票
发票代码：144001900111
发票号码：20938475
金额：￥356.00
开票日期：2026/03/15
""",
        invoice_number="20938475",
        total="356.00",
        currency="￥",
        date="2026/03/15",
    ),
    _doc(
        "invoice",
        "zh",
        6,
        """
报价及账单
客户：刘先生
服务内容：空调清洗 3 台
总计 450 元
请于 2026年4月10日 前付款
""",
        total="450",
        currency="元",
        due_date="2026年4月10日",
    ),
    _doc(
        "invoice",
        "zh",
        7,
        """
INVOICE 发票
No. HK-33109
日期 Date: 2026-03-09
合计 Total: HKD 3,800.00
""",
        invoice_number="HK-33109",
        total="3800.00",
        currency="HKD",
        date="2026-03-09",
    ),
    _doc(
        "invoice",
        "zh",
        8,
        """
账单号：B2026031201
账单日：2026年3月12日
本期应还金额：5,620.88
最后还款日：2026年4月1日
客服电话：95588
""",
        invoice_number="B2026031201",
        total="5620.88",
        date="2026年3月12日",
        due_date="2026年4月1日",
    ),
    # -- receipts: merchant, total, tax, date, phone ---------------------------------------------
    _doc(
        "receipt",
        "en",
        1,
        """
TRADER JOE'S
2001 Market St
San Francisco CA 94114
Tel (415) 555-0139
BANANAS           0.29
GREEK YOGURT      4.99
SOURDOUGH         3.99
SUBTOTAL          9.27
TAX               0.00
TOTAL            $9.27
VISA ****1123
03/04/2026 12:41 PM
""",
        merchant="TRADER JOE'S",
        total="9.27",
        tax="0.00",
        date="03/04/2026",
        phone="(415) 555-0139",
    ),
    _doc(
        "receipt",
        "en",
        2,
        """
Blue Bottle Coffee
Order #4471
1 Latte        5.50
1 Croissant    4.25
Total          9.75
Thank you!
""",
        merchant="Blue Bottle Coffee",
        total="9.75",
    ),
    _doc(
        "receipt",
        "en",
        3,
        """
Shell
Station 2231, Hauptstr. 12, Berlin
14 Feb 2026   07:52
PUMP 04  UNLEADED
32.418 L @ 1.879
FUEL TOTAL   EUR 60.91
incl. VAT 19%   9.73
Thank you for your visit
""",
        merchant="Shell",
        total="60.91",
        tax="9.73",
        date="14 Feb 2026",
    ),
    _doc(
        "receipt",
        "en",
        4,
        """
WALGREENS #09812
STORE 555-212-4410
ADVIL 50CT          8.99
VITAMIN D3         12.49
SUBTOTAL           21.48
SALES TAX 8.875%    1.91
TOTAL              23.39
CASH               30.00
CHANGE              6.61
2026-02-19 18:03
""",
        merchant="WALGREENS",
        total="23.39",
        tax="1.91",
        date="2026-02-19",
        phone="555-212-4410",
    ),
    _doc(
        "receipt",
        "en",
        5,
        """
Pizzeria Bella Napoli
Table 7
2x Margherita   18.00
1x Tiramisu      6.50
2x Water         4.00
Total EUR       28.50
Grazie e arrivederci!
Tel. 06 4567 8910
""",
        merchant="Pizzeria Bella Napoli",
        total="28.50",
        phone="06 4567 8910",
    ),
    _doc(
        "receipt",
        "en",
        6,
        """
Uber
Thanks for riding, Maya
March 2, 2026
Trip fare     $14.20
Booking fee    $2.35
Tip            $3.00
Total         $19.55
""",
        merchant="Uber",
        total="19.55",
        date="March 2, 2026",
    ),
    _doc(
        "receipt",
        "en",
        7,
        """
HOME DEPOT
1234 Elm Ave, Austin TX
(512) 555-0166
2x4x8 STUD    8 @ 3.98   31.84
WOOD SCREWS              9.97
SUBTOTAL                41.81
TAX                      3.45
TOTAL                   45.26
01/28/26
""",
        merchant="HOME DEPOT",
        total="45.26",
        tax="3.45",
        date="01/28/26",
        phone="(512) 555-0166",
    ),
    _doc(
        "receipt",
        "en",
        8,
        """
Amazon.com order receipt
Order placed: 5 February 2026
Items: USB-C cable (2-pack)
Item(s) subtotal: $12.99
Estimated tax: $1.07
Grand Total: $14.06
""",
        merchant="Amazon.com",
        total="14.06",
        tax="1.07",
        date="5 February 2026",
    ),
    _doc(
        "receipt",
        "en",
        9,
        """
Farmers market - cash receipt
Green Acres Farm
3 lb apples 6.00
honey 12.00
total 18
""",
        merchant="Green Acres Farm",
        total="18",
    ),
    _doc(
        "receipt",
        "en",
        10,
        """
CVS pharmacy
Feb 27 2026  9:14AM
Store 1-800-746-7287
RX COPAY         10.00
Total            10.00
ExtraCare savings 0.00
""",
        merchant="CVS pharmacy",
        total="10.00",
        date="Feb 27 2026",
        phone="1-800-746-7287",
    ),
    _doc(
        "receipt",
        "zh",
        1,
        """
全家便利店
上海市徐汇区漕溪北路88号
电话：021-6438 1122
饭团          6.50
乌龙茶        5.00
合计：11.50
实收：20.00
找零：8.50
2026-03-04 08:12
""",
        merchant="全家便利店",
        total="11.50",
        date="2026-03-04",
        phone="021-6438 1122",
    ),
    _doc(
        "receipt",
        "zh",
        2,
        """
星巴克咖啡
拿铁（大杯） ¥36
蓝莓麦芬 ¥22
应付金额 ¥58
微信支付
2026年2月14日
""",
        merchant="星巴克咖啡",
        total="58",
        date="2026年2月14日",
    ),
    _doc(
        "receipt",
        "zh",
        3,
        """
麦当劳 McDonald's
订单号 235
巨无霸套餐 1 × 38.00
麦旋风 1 × 15.50
总计：53.50 元
税额：3.03
服务热线 400-920-0205
""",
        merchant="麦当劳",
        total="53.50",
        tax="3.03",
        phone="400-920-0205",
    ),
    _doc(
        "receipt",
        "zh",
        4,
        """
加油凭证
中国石化 第3312加油站
日期：2026/01/22
92#汽油 40.25升 单价7.45
金额：299.86元
""",
        merchant="中国石化",
        total="299.86",
        date="2026/01/22",
    ),
    _doc(
        "receipt",
        "zh",
        5,
        """
永辉超市
收银员：0231
商品 数量 金额
大米5kg 1 45.90
食用油 1 69.80
鸡蛋 2 25.60
件数：4
总金额：141.30
会员卡号：6230 8811 2233
日期：2026.02.08
""",
        merchant="永辉超市",
        total="141.30",
        date="2026.02.08",
    ),
    _doc(
        "receipt",
        "zh",
        6,
        """
海底捞火锅（西单店）
桌号：A12  人数：4
消费合计：￥826.00
优惠：￥50.00
实付：￥776.00
电话：010-6617 8899
2026年3月1日 20:45
""",
        merchant="海底捞火锅",
        total="776.00",
        date="2026年3月1日",
        phone="010-6617 8899",
    ),
    _doc(
        "receipt",
        "zh",
        7,
        """
滴滴出行 行程单
起点：浦东机场T2  终点：静安寺
里程 45.2 公里
车费合计 ¥ 168.40
""",
        merchant="滴滴出行",
        total="168.40",
    ),
    _doc(
        "receipt",
        "zh",
        8,
        """
屈臣氏 Watsons
2026-02-25
洗面奶 59.90
面膜 10片装 99.00
合计 158.90
其中增值税 18.28
客服 400-830-8838
""",
        merchant="屈臣氏",
        total="158.90",
        tax="18.28",
        date="2026-02-25",
        phone="400-830-8838",
    ),
    # -- notices: recipient, date, time, place, fee ----------------------------------------------
    _doc(
        "notice",
        "en",
        1,
        """
NOTICE OF ANNUAL GENERAL MEETING
Members of the Oakridge Tennis Club are invited to the AGM on Saturday, 21 March 2026 at 10:00 am
in the Clubhouse Lounge. Annual dues of $120 are payable at the meeting.
""",
        date="21 March 2026",
        time="10:00 am",
        place="Clubhouse Lounge",
        fee="120",
    ),
    _doc(
        "notice",
        "en",
        2,
        """
Dear Ms. Emily Carter,

You are invited to the quarterly planning meeting on 2026-04-07 at 2:00 PM in Conference Room B.

Facilities Team
""",
        recipient="Emily Carter",
        date="2026-04-07",
        time="2:00 PM",
        place="Conference Room B",
    ),
    _doc(
        "notice",
        "en",
        3,
        """
WATER SHUT-OFF
Due to pipe repairs, water will be off on 03/10/2026 from 9 a.m. to 1 p.m.
We apologize for the inconvenience. - Building Management
""",
        date="03/10/2026",
        time="9 a.m.",
    ),
    _doc(
        "notice",
        "en",
        4,
        "Book Club - this month we're reading 'Klara and the Sun'. See you at Hazel's place, 7 pm, bring a snack!",
        time="7 pm",
        place="Hazel's place",
    ),
    _doc(
        "notice",
        "en",
        5,
        """
Dear Mr. Robert Nguyen,

This is to inform you that your jury service has been scheduled for Monday, April 13, 2026, at 8:30 AM
at the County Courthouse, 100 Main Street, Room 210.
""",
        recipient="Robert Nguyen",
        date="April 13, 2026",
        time="8:30 AM",
        place="County Courthouse, 100 Main Street, Room 210",
    ),
    _doc(
        "notice",
        "en",
        6,
        """
ATTENTION ALL STAFF
Fire drill this Thursday. When the alarm sounds, leave by the nearest exit and gather in the north
parking lot.
""",
        place="north parking lot",
    ),
    _doc(
        "notice",
        "en",
        7,
        """
Parent-Teacher Conference
Date: 5 May 2026
Time: 16:00 - 19:00
Location: Lincoln Elementary, Gym
Registration fee: none
""",
        date="5 May 2026",
        time="16:00",
        place="Lincoln Elementary, Gym",
    ),
    _doc(
        "notice",
        "en",
        8,
        """
Yoga in the Park!
Every Sunday starting April 5, 2026, 8am, Riverside Park. $10 drop-in, mats provided. Info: 555-0190
""",
        date="April 5, 2026",
        time="8am",
        place="Riverside Park",
        fee="10",
    ),
    _doc("notice", "en", 9, "Our cat knocked the plant off the windowsill again."),
    _doc(
        "notice",
        "en",
        10,
        "Hi Mr. Dave Collins - reminder that your car is booked for its service on 2026-03-27 "
        "at 11:15. Estimated cost £149. Greenway Motors, Unit 4 Mill Lane.",
        recipient="Dave Collins",
        date="2026-03-27",
        time="11:15",
        place="Greenway Motors, Unit 4 Mill Lane",
        fee="149",
    ),
    _doc(
        "notice",
        "zh",
        1,
        """
会议通知
尊敬的王小明先生：
兹定于2026年3月20日（星期五）下午2:00在公司三楼第一会议室召开年度总结会议，请准时参加。
行政办公室
""",
        recipient="王小明",
        date="2026年3月20日",
        time="下午2:00",
        place="公司三楼第一会议室",
    ),
    _doc(
        "notice",
        "zh",
        2,
        """
停电通知
因线路检修，本小区将于3月15日 8:00-17:00 停电，请各位业主提前做好准备。
物业服务中心
""",
        date="3月15日",
        time="8:00",
    ),
    _doc(
        "notice",
        "zh",
        3,
        """
各位家长：
本学期家长会定于4月10日晚上7点在学校礼堂举行，届时请准时出席。
阳光小学 教务处
""",
        date="4月10日",
        time="晚上7点",
        place="学校礼堂",
    ),
    _doc(
        "notice",
        "zh",
        4,
        """
活动报名
春季徒步活动将于2026-04-18 早上7:30从人民广场出发，报名费 80 元/人，咨询电话 139 0000 1111。
""",
        date="2026-04-18",
        time="早上7:30",
        place="人民广场",
        fee="80",
    ),
    _doc("notice", "zh", 5, "我今天中午吃了一碗牛肉面，味道不错。"),
    _doc(
        "notice",
        "zh",
        6,
        """
尊敬的李华女士：
您预约的体检时间为2026年5月8日上午8:30，地点：市第一人民医院体检中心二楼。请空腹前往，体检费用 ¥680 已支付。
""",
        recipient="李华",
        date="2026年5月8日",
        time="上午8:30",
        place="市第一人民医院体检中心二楼",
        fee="680",
    ),
    _doc("notice", "zh", 7, "通知：因系统维护，本周六暂停借还服务，给您带来不便敬请谅解。"),
    _doc(
        "notice",
        "zh",
        8,
        """
亲爱的赵刚同学：
恭喜你通过初试！复试安排在2026/06/02 09:30，地点为理科楼 B204。请携带身份证。
""",
        recipient="赵刚",
        date="2026/06/02",
        time="09:30",
        place="理科楼 B204",
    ),
]
