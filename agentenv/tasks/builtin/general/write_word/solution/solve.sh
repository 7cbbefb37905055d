echo {{ word }} > /workspace/answer.txt
