echo {{ n }} > /workspace/answer.txt
echo {{ n }}
